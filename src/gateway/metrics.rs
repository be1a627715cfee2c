//! The gateway's Prometheus endpoint (`serve --metrics ADDR`): `GET /metrics` answers
//! the harness's [`Metrics`](crate::Metrics) in the text exposition format, on a
//! listener of its own, so that scrapers need no MCP token and the MCP listener stays
//! the only one exposed. Bind it to an address only the scrapers reach: it names every
//! server.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use crate::harness::HarnessHandle;

/// Connections served at once; scrapers are few.
const MAX_CONNECTIONS: usize = 64;

fn answer(harness: &HarnessHandle, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            harness.metrics().prometheus(),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

/// Serves `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    harness: HarnessHandle,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let connections = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
                    tracing::warn!(error = %e, "metrics: accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let harness = harness.clone();
        let service = hyper::service::service_fn(move |req| {
            let response = answer(&harness, &req);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(async move {
            // A scrape is one short request: a connection held longer loses its slot.
            let _ = tokio::time::timeout(Duration::from_secs(60), connection).await;
            drop(permit);
        });
    }
}
