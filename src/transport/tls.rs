//! TLS for HTTPS servers and their authorization servers: rustls with the `ring`
//! provider, the platform's trusted roots (`rustls-native-certs`, which also reads
//! `SSL_CERT_FILE` and `SSL_CERT_DIR`) plus a server's own `ca_file`. (Telling TLS
//! failures apart is [`crate::transport::error`]'s.)
//!
//! The client config is built here and handed to reqwest preconfigured, so no
//! process-wide crypto provider is installed behind an embedder's back.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

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

/// Reads the platform's roots now, if not yet (blocking: a directory of files), so the
/// first HTTPS connection does not on an async thread.
pub(crate) fn warm_platform_roots() {
    let _ = platform_roots();
}

/// A CA bundle that cannot be used: what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsConfigError(pub String);

/// A rustls client config trusting the platform's roots and the PEM bundle at `ca_file`
/// (ring, TLS 1.2 and 1.3): the one every HTTPS client of the harness uses, for an
/// embedder's own clients (an OTLP exporter) to trust the same.
pub fn tls_client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsConfigError> {
    client_config(ca_file).map_err(TlsConfigError)
}

/// [`tls_client_config`], its error as text (for the layers' own error types).
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(platform_roots().iter().cloned());
    if let Some(path) = ca_file {
        let bad = |e: String| format!("ca_file {}: {e}", path.display());
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
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
