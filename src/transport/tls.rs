//! TLS for HTTPS servers: rustls with the `ring` provider, the platform's trusted roots
//! (`rustls-native-certs`, which also reads `SSL_CERT_FILE` and `SSL_CERT_DIR`) plus a
//! server's own `ca_file`, and TLS failures told apart by kind.
//!
//! The client config is built here and handed to reqwest preconfigured, so no
//! process-wide crypto provider is installed behind an embedder's back.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::transport::error::{TlsFailure, TransportError};

/// The platform's roots, read once per process.
fn platform_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(error = %e, "could not read some platform certificates");
        }
        found.certs
    })
}

/// A rustls client config trusting the platform's roots and the PEM bundle at `ca_file`.
pub(crate) fn client_config(
    ca_file: Option<&Path>,
) -> Result<rustls::ClientConfig, TransportError> {
    let mut roots = RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(platform_roots().iter().cloned());
    if let Some(path) = ca_file {
        let bad =
            |e: String| TransportError::InvalidConfig(format!("ca_file {}: {e}", path.display()));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("holds no PEM certificate".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError::InvalidConfig(format!("TLS versions: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The TLS failure somewhere in `error`'s source chain, if there is one. rustls errors
/// arrive wrapped in `io::Error`s, whose `source()` skips what they wrap: descend through
/// `get_ref()` instead.
pub(crate) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<TransportError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(classify(tls));
        }
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn classify(error: &rustls::Error) -> TransportError {
    use rustls::CertificateError as C;
    let kind = match error {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature | C::UnknownRevocationStatus => {
                TlsFailure::UntrustedCertificate
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsFailure::NameMismatch,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => TlsFailure::Expired,
            _ => TlsFailure::UntrustedCertificate,
        },
        _ => TlsFailure::Handshake,
    };
    TransportError::Tls {
        kind,
        detail: error.to_string(),
    }
}
