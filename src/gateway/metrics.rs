//! The gateway's Prometheus endpoint (`serve --metrics ADDR`): `GET /metrics` answers
//! the harness's [`Metrics`](crate::Metrics) in the text exposition format, on a
//! listener of its own, so that scrapers need no MCP token and the MCP listener stays
//! the only one exposed. Bind it to an address only the scrapers reach: it names every
//! server.

use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use crate::harness::HarnessHandle;

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
    super::side::serve("metrics", listener, shutdown, move |req| {
        let response = answer(&harness, &req);
        async move { response }
    })
    .await;
}
