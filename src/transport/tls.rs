//! TLS for HTTPS servers and their authorization servers: rustls with the `ring`
//! provider, the platform's trusted roots (`rustls-native-certs`, which also reads
//! `SSL_CERT_FILE` and `SSL_CERT_DIR`) plus a server's own `ca_file`. (Telling TLS
//! failures apart is [`crate::transport::error`]'s.)
//!
//! The client config is built here and handed to reqwest preconfigured, so no
//! process-wide crypto provider is installed behind an embedder's back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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

/// The largest CA bundle read (the platform's own is under a megabyte).
const MAX_CA_FILE: u64 = 16 << 20;

/// A CA bundle's bytes: a regular file only, opened without waiting (a FIFO put in its
/// place would hold the async thread that connects a server, at every restart), and
/// up to [`MAX_CA_FILE`].
fn read_ca_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_CA_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CA_FILE {
        return Err(format!("larger than {} MiB", MAX_CA_FILE >> 20));
    }
    Ok(bytes)
}

/// A CA bundle's bytes and the certificates in them, read as [`read_ca_file`] does;
/// one that holds none is refused.
fn ca_certificates(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
    let bad = |e: String| format!("ca_file {}: {e}", path.display());
    let pem = read_ca_file(path).map_err(bad)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok((pem, certs))
}

/// A CA bundle's PEM, read and checked as a server's `ca_file` is (a regular file, at
/// most 16 MiB, holding PEM certificates): for an embedder's own TLS stack (a gRPC
/// exporter's) to trust what the harness's clients trust.
pub fn ca_file_pem(path: &Path) -> Result<Vec<u8>, TlsConfigError> {
    ca_certificates(path)
        .map(|(pem, _)| pem)
        .map_err(TlsConfigError)
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
        let (_, certs) = ca_certificates(path)?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
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

/// Why a connection's TLS config could not be made.
#[derive(Debug)]
pub(crate) enum CaRead {
    /// The CA bundle cannot be used: what is wrong with it.
    Invalid(String),
    /// Its read did not end within this bound (a restart may heal it).
    Late(Duration),
}

/// [`client_config`] for a server's connection, which is made again at each restart on
/// an async thread: a `ca_file` is read on a blocking thread, for at most `bound`. A
/// read still under way (a hung network mount) holds its path, so later connections
/// wait for it rather than start one more stuck thread each, and give up at their own
/// bound with [`CaRead::Late`].
pub(crate) async fn connection_config(
    ca_file: Option<&Path>,
    bound: Duration,
) -> Result<rustls::ClientConfig, CaRead> {
    match ca_file {
        None => client_config(None).map_err(CaRead::Invalid),
        Some(path) => read_within(path, bound, |p| client_config(Some(p))).await,
    }
}

/// Runs `read` of `path` on a blocking thread, one at a time per path, for at most
/// `bound`.
async fn read_within<T: Send + 'static>(
    path: &Path,
    bound: Duration,
    read: fn(&Path) -> Result<T, String>,
) -> Result<T, CaRead> {
    // One lock per distinct `ca_file` of the config: a few entries, never removed.
    static READING: OnceLock<parking_lot::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
        OnceLock::new();
    let lock = READING
        .get_or_init(Default::default)
        .lock()
        .entry(path.to_path_buf())
        .or_default()
        .clone();
    let owned = path.to_path_buf();
    let reading = async move {
        let held = lock.lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let _held = held;
            read(&owned)
        })
        .await
    };
    match tokio::time::timeout(bound, reading).await {
        Ok(Ok(read)) => read.map_err(CaRead::Invalid),
        Ok(Err(e)) => Err(CaRead::Invalid(format!("ca_file {}: {e}", path.display()))),
        Err(_) => {
            tracing::warn!(ca_file = %path.display(), ?bound, "the ca_file was not read in time (a hung mount?); the server's start is tried again");
            Err(CaRead::Late(bound))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    // A CA bundle whose read hangs (a network mount gone) holds no async thread: each
    // connection gives up at its bound with a timeout, which a restart may heal, and
    // those that come while it hangs wait for that read rather than start their own.
    #[tokio::test(flavor = "current_thread")]
    async fn a_ca_file_whose_read_hangs_is_given_up_at_the_bound_one_read_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        fn hang(_: &std::path::Path) -> Result<(), String> {
            STARTED.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(1));
            Ok(())
        }
        let path = std::path::Path::new("/nonexistent/hung-mount/ca.pem");
        let bound = Duration::from_millis(200);
        // The current-thread runtime would not run these timers if a read held it.
        let (first, second) = tokio::join!(
            super::read_within(path, bound, hang),
            super::read_within(path, bound, hang),
        );
        for read in [first, second] {
            assert!(
                matches!(read, Err(super::CaRead::Late(b)) if b == bound),
                "{read:?}"
            );
        }
        let third = super::read_within(path, bound, hang).await;
        assert!(matches!(third, Err(super::CaRead::Late(_))), "{third:?}");
        assert_eq!(
            STARTED.load(Ordering::SeqCst),
            1,
            "one stuck thread, not one each"
        );
        // Once that read ends, the next one runs.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let fourth = super::read_within(path, Duration::from_secs(5), hang).await;
        assert!(fourth.is_ok(), "{fourth:?}");
        assert_eq!(STARTED.load(Ordering::SeqCst), 2);
    }

    // A FIFO put in a CA bundle's place is refused at once. Before, connecting the
    // server (at each restart, on an async thread) waited for a writer.
    #[test]
    fn a_ca_file_that_is_a_fifo_is_refused_at_once() {
        let dir = crate::util::scratch::Scratch::new("ca-fifo");
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("ca.pem");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(super::client_config(Some(&path)).map(|_| ()));
        });
        let read = rx.recv_timeout(Duration::from_secs(10)).expect("at once");
        assert!(
            read.as_ref()
                .is_err_and(|e| e.contains("not a regular file")),
            "{read:?}"
        );
    }
}
