//! The disk layer (L2): one JSON file per entry under `DIR/SERVER/`, named by the hash
//! of the key it holds, so that a restarted harness serves fresh entries without asking
//! its servers. It trusts nothing it reads: a file is used only if its name is the hash
//! of the key inside and the key's server is the directory it sits in; files are
//! created 0600 in 0700 directories, written to a temporary file and renamed, so a
//! crash never leaves half an entry. All of it is blocking I/O: the registry actor runs
//! it on a blocking thread.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{CacheKey, Entry, now_ms};
use crate::util::hash::sha256_hex;

/// The file name an entry with `key` must have.
fn file_name(key: &CacheKey) -> String {
    format!(
        "{}.json",
        sha256_hex(serde_json::to_string(key).unwrap_or_default().as_bytes())
    )
}

fn make_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// Writes one entry.
pub(super) fn write(dir: &Path, entry: &Entry) -> std::io::Result<()> {
    make_dir(dir)?;
    let server_dir = dir.join(&entry.key.server);
    make_dir(&server_dir)?;
    let path = server_dir.join(file_name(&entry.key));
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&serde_json::to_vec(entry)?)?;
    drop(file);
    std::fs::rename(tmp, path)
}

/// Removes every entry of `server`.
pub(super) fn remove_server(dir: &Path, server: &str) {
    let _ = std::fs::remove_dir_all(dir.join(server));
}

/// Removes the entries of `server` whose keys `drop` picks.
pub(super) fn remove_where(dir: &Path, server: &str, drop: impl Fn(&CacheKey) -> bool) {
    for (path, entry) in read_server(&dir.join(server), server) {
        if drop(&entry.key) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn read_server(server_dir: &Path, server: &str) -> Vec<(PathBuf, Entry)> {
    let mut out = Vec::new();
    let Ok(files) = std::fs::read_dir(server_dir) else {
        return out;
    };
    for file in files.flatten() {
        let path = file.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let entry = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
        let named_right = |e: &Entry| {
            e.key.server == server
                && path.file_name().and_then(|n| n.to_str()) == Some(file_name(&e.key).as_str())
        };
        match entry {
            Some(e) if named_right(&e) => out.push((path, e)),
            _ => {
                tracing::warn!(path = %path.display(), "ignoring a cache file whose name is not the hash of its key");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// Reads every fresh entry under `dir`; expired and untrustworthy files are removed.
pub(super) fn load(dir: &Path) -> HashMap<CacheKey, Entry> {
    let now = now_ms();
    let mut entries = HashMap::new();
    let Ok(servers) = std::fs::read_dir(dir) else {
        return entries;
    };
    for server in servers.flatten() {
        let Some(name) = server.file_name().to_str().map(String::from) else {
            continue;
        };
        if crate::server::check_id(&name).is_err() {
            continue;
        }
        for (path, entry) in read_server(&server.path(), &name) {
            if entry.expires_unix_ms > now {
                entries.insert(entry.key.clone(), entry);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    entries
}
