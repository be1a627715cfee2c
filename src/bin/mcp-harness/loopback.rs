//! What the demo servers share to serve HTTP (or HTTPS, with a certificate given) on
//! loopback: the listener loop over hyper, the TLS acceptor, the `listening URL` line
//! their parents read, and plain responses.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::StatusCode;
use hyper::body::Incoming;

/// A response body.
pub type HttpBody = BoxBody<Bytes, Infallible>;
/// A response.
pub type HttpResponse = hyper::Response<HttpBody>;

/// A response with `status`, `content_type` (none when empty) and `body`.
pub fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = hyper::Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    if !content_type.is_empty()
        && let Ok(v) = content_type.parse()
    {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// A TLS acceptor for a PEM certificate chain and key, when both are given.
pub fn tls_acceptor(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let (Some(cert), Some(key)) = (cert, key) else {
        return Ok(None);
    };
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// Binds `addr`, prints `listening SCHEME://ADDR{path}` as the first line on stdout,
/// and (unless `stay`) exits when stdin closes, which is how a parent stops it.
pub async fn bind(
    addr: &str,
    tls: bool,
    path: &str,
    stay: bool,
) -> anyhow::Result<(tokio::net::TcpListener, String)> {
    use std::io::Write;
    // Test servers: their tools show the environment and start processes, and they
    // check no Host or Origin. Nobody but this machine's own clients may reach one, so
    // no other address is bound, even for a moment.
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    if let Some(other) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        anyhow::bail!(
            "{other} is not a loopback address: the demo servers listen on loopback only"
        );
    }
    let listener = tokio::net::TcpListener::bind(&addrs[..]).await?;
    let local = listener.local_addr()?;
    let scheme = if tls { "https" } else { "http" };
    let base = format!("{scheme}://{local}");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {base}{path}")?;
        out.flush()?;
    }
    if !stay {
        tokio::spawn(async {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
            std::process::exit(0);
        });
    }
    Ok((listener, base))
}

/// Serves every connection on `listener` with `handler`, over TLS when `tls` is set.
pub async fn serve<H, F>(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handler: H,
) -> anyhow::Result<()>
where
    H: Fn(hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    loop {
        // A failed accept (out of descriptors, a connection reset before it was
        // taken) ends that connection, not the server: a pause, and on.
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (tls, handler) = (tls.clone(), handler.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(req).await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(tls) => {
                    if let Ok(stream) = tls.accept(stream).await {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                }
                None => {
                    let _ = http
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}
