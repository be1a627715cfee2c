//! The gateway's side listeners (`--metrics`, `--admin`): plain HTTP/1.1, a few
//! connections at once, each held at most a minute, answered by one async function.

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
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            () = &mut shutdown => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(listener = what, error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
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
