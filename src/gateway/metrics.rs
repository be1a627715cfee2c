//! The gateway's Prometheus endpoint (`serve --metrics ADDR`): `GET /metrics` answers
//! the harness's [`Metrics`](crate::Metrics) in the text exposition format, on a
//! listener of its own, so that scrapers need no MCP token and the MCP listener stays
//! the only one exposed. With `[gateway] metrics_tokens` it asks for one of those
//! bearer tokens; without, bind it to an address only the scrapers reach: it names
//! every server. The text is rendered at most once per [`RENDERED_FOR`], however many
//! scrapers ask.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use super::Tokens;
use crate::harness::HarnessHandle;

/// How long one rendering of the metrics answers scrapes: far below any scrape
/// interval, and a flood of scrapes renders them once a second.
pub const RENDERED_FOR: Duration = Duration::from_secs(1);

/// The last rendering, and when it was made.
#[derive(Default)]
struct Rendered(parking_lot::Mutex<Option<(Instant, Bytes)>>);

impl Rendered {
    fn text(&self, harness: &HarnessHandle) -> Bytes {
        let mut last = self.0.lock();
        if let Some((at, text)) = last.as_ref()
            && at.elapsed() < RENDERED_FOR
        {
            return text.clone();
        }
        let text = Bytes::from(harness.metrics().prometheus());
        *last = Some((Instant::now(), text.clone()));
        text
    }
}

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
    rendered: &Rendered,
    allowed_hosts: &[String],
    tokens: &Tokens,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let text = |s: &'static str| Bytes::from_static(s.as_bytes());
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        _ if !host_allowed(req, allowed_hosts) => (
            StatusCode::FORBIDDEN,
            "text/plain",
            text("Host is not this listener (gateway.allowed_hosts)\n"),
        ),
        _ if !{
            let tokens = tokens();
            tokens.is_empty() || super::side::bearer_allowed(req.headers(), &tokens)
        } =>
        {
            (
                StatusCode::UNAUTHORIZED,
                "text/plain",
                text("a bearer token of gateway.metrics_tokens is required\n"),
            )
        }
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            rendered.text(harness),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            text("GET only\n"),
        ),
        _ => (StatusCode::NOT_FOUND, "text/plain", text("not found\n")),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// Serves `/metrics` on `listener` until `shutdown` resolves, to requests whose `Host`
/// is an address, `localhost`, or one of `allowed_hosts` (the gateway's), and that
/// carry one of the `tokens` in force when there are any.
pub async fn serve(
    harness: HarnessHandle,
    listener: tokio::net::TcpListener,
    allowed_hosts: Vec<String>,
    tokens: Tokens,
    shutdown: impl Future<Output = ()>,
) {
    let allowed_hosts = std::sync::Arc::new(allowed_hosts);
    let rendered = std::sync::Arc::new(Rendered::default());
    super::side::serve("metrics", listener, shutdown, move |req| {
        let response = answer(&harness, &rendered, &allowed_hosts, &tokens, &req);
        async move { response }
    })
    .await;
}
