//! The audit file: JSON Lines appended in batches, never a torn or doubled record.
//!
//! The writer remembers the offset after the last batch that was written whole. A write
//! that fails part-way is cut back to that offset, so a partial batch never stays in
//! the file and the retry writes it once. The file is created 0600.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where batches go: the file, or a stand-in in unit tests.
pub(super) trait Output: Send {
    /// Appends `bytes` at the end.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts the output back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
    /// Its length now.
    fn len(&mut self) -> std::io::Result<u64>;
}

struct FileOutput(std::fs::File);

impl Output for FileOutput {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_all(bytes)?;
        self.0.flush()
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn len(&mut self) -> std::io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

/// Opens outputs: the real file, or a test's stand-in.
pub(super) type Opener = Box<dyn FnMut() -> std::io::Result<Box<dyn Output>> + Send>;

/// An opener for the audit file at `path` (created 0600, with its directory).
pub(super) fn file_opener(path: PathBuf) -> Opener {
    Box::new(move || {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Box::new(FileOutput(file)) as Box<dyn Output>)
    })
}

/// The writer: an output opened on demand (and again after a failure), and the offset
/// of the last whole batch.
pub(super) struct AuditFile {
    open: Opener,
    output: Option<Box<dyn Output>>,
    /// The length after the last batch written whole; `None` until first opened.
    good: Option<u64>,
}

impl AuditFile {
    pub(super) fn new(open: Opener) -> AuditFile {
        AuditFile {
            open,
            output: None,
            good: None,
        }
    }

    /// Appends one batch, all of it or (after cutting back a partial write) none of it.
    pub(super) fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.output.is_none() {
            let mut output = (self.open)()?;
            let len = output.len()?;
            match self.good {
                // Reopened after a failure whose cut did not happen: cut now.
                Some(good) if len > good => output.truncate(good)?,
                Some(_) => {}
                None => self.good = Some(len),
            }
            self.output = Some(output);
        }
        let good = self.good.unwrap_or(0);
        let Some(output) = self.output.as_mut() else {
            return Err(std::io::Error::other("audit output not open"));
        };
        match output.append(bytes) {
            Ok(()) => {
                self.good = Some(good + bytes.len() as u64);
                Ok(())
            }
            Err(e) => {
                // A torn batch must not stay; if the cut fails too, the next open cuts.
                if output.truncate(good).is_err() {
                    tracing::warn!("could not cut the audit file back after a failed write");
                }
                self.output = None;
                Err(e)
            }
        }
    }
}

/// The key of the audit trail's auth-context hashes, kept beside the audit file
/// (`PATH.key`, 0600): the same context hashes the same across restarts, and nobody
/// without the key can test a guess against a record. Without a file, a key per process.
pub(super) fn load_or_create_key(audit_path: Option<&Path>) -> Vec<u8> {
    let fresh = || {
        let mut key = vec![0u8; 32];
        if getrandom::fill(&mut key).is_err() {
            tracing::error!("no OS randomness for the audit key; using a per-process fallback");
            key = crate::util::hash::sha256_hex(
                format!("{:?}", std::time::SystemTime::now()).as_bytes(),
            )
            .into_bytes();
        }
        key
    };
    let Some(path) = audit_path else {
        return fresh();
    };
    let key_path = PathBuf::from(format!("{}.key", path.display()));
    if let Ok(key) = std::fs::read(&key_path)
        && key.len() >= 32
    {
        return key;
    }
    let key = fresh();
    use std::os::unix::fs::OpenOptionsExt;
    let written = key_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&key_path)
        })
        .and_then(|mut f| f.write_all(&key));
    if let Err(e) = written {
        tracing::warn!(path = %key_path.display(), error = %e, "could not keep the audit hash key; hashes will differ after a restart");
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use parking_lot::Mutex;

    /// An output that writes into a shared buffer and fails as told: `fail_after`
    /// bytes of the next append are written, then an error.
    #[derive(Clone, Default)]
    struct Flaky {
        data: Arc<Mutex<Vec<u8>>>,
        fail_after: Arc<Mutex<Option<usize>>>,
        fail_opens: Arc<Mutex<usize>>,
    }

    impl Output for Flaky {
        fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            match self.fail_after.lock().take() {
                Some(n) => {
                    self.data
                        .lock()
                        .extend_from_slice(&bytes[..n.min(bytes.len())]);
                    Err(std::io::Error::other("disk full"))
                }
                None => {
                    self.data.lock().extend_from_slice(bytes);
                    Ok(())
                }
            }
        }
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            self.data.lock().truncate(len as usize);
            Ok(())
        }
        fn len(&mut self) -> std::io::Result<u64> {
            Ok(self.data.lock().len() as u64)
        }
    }

    fn opener(f: &Flaky) -> Opener {
        let f = f.clone();
        Box::new(move || {
            let mut opens = f.fail_opens.lock();
            if *opens > 0 {
                *opens -= 1;
                return Err(std::io::Error::other("cannot open"));
            }
            Ok(Box::new(f.clone()) as Box<dyn Output>)
        })
    }

    #[test]
    fn a_partial_write_is_cut_back_and_written_once_on_retry() {
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n").expect("first batch");
        *flaky.fail_after.lock() = Some(5);
        assert!(file.write(b"{\"b\":2}\n{\"c\":3}\n").is_err());
        assert_eq!(&*flaky.data.lock(), b"{\"a\":1}\n", "no torn record stays");
        *flaky.fail_opens.lock() = 2;
        assert!(
            file.write(b"{\"b\":2}\n{\"c\":3}\n").is_err(),
            "cannot reopen yet"
        );
        assert!(file.write(b"{\"b\":2}\n{\"c\":3}\n").is_err());
        file.write(b"{\"b\":2}\n{\"c\":3}\n")
            .expect("written once it can");
        assert_eq!(
            &*flaky.data.lock(),
            b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n",
            "each record exactly once"
        );
    }
}
