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

/// Whether `Host` names this listener as a scraper would: an address, a loopback name,
/// or one of `gateway.allowed_hosts`. A page that rebinds its own name to this
/// address (DNS rebinding) sends its name, and reads nothing.
fn host_allowed(req: &Request<hyper::body::Incoming>, allowed: &[String]) -> bool {
    let Some(host) = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let address = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        // An IPv6 literal may carry a zone (`fe80::1%25eth0`), which no address parses.
        Some(v6) => v6
            .split_once('%')
            .map_or(v6, |(a, _)| a)
            .parse::<std::net::Ipv6Addr>()
            .is_ok(),
        None => name.parse::<std::net::Ipv4Addr>().is_ok(),
    };
    address
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn answer(
    harness: &HarnessHandle,
    allowed_hosts: &[String],
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        _ if !host_allowed(req, allowed_hosts) => (
            StatusCode::FORBIDDEN,
            "text/plain",
            "Host is not this listener (gateway.allowed_hosts)\n".to_string(),
        ),
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

/// Serves `/metrics` on `listener` until `shutdown` resolves, to requests whose `Host`
/// is an address, `localhost`, or one of `allowed_hosts` (the gateway's).
pub async fn serve(
    harness: HarnessHandle,
    listener: tokio::net::TcpListener,
    allowed_hosts: Vec<String>,
    shutdown: impl Future<Output = ()>,
) {
    let allowed_hosts = std::sync::Arc::new(allowed_hosts);
    super::side::serve("metrics", listener, shutdown, move |req| {
        let response = answer(&harness, &allowed_hosts, &req);
        async move { response }
    })
    .await;
}
