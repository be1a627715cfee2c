//! The disk layer (L2): one JSON file per entry under `DIR/SERVER/`, named by the hash
//! of the key it holds, so that a restarted harness serves fresh entries without asking
//! its servers. It trusts nothing it reads: a file is used only if its name is the hash
//! of the key inside and the key's server is the directory it sits in; files are
//! created 0600 in 0700 directories, written to a temporary file of a random name
//! (created, never reused) and renamed, so a crash never leaves half an entry. Links
//! and anything but plain files and directories are skipped, never followed or
//! removed; a file is read up to [`MAX_FILE`] bytes; a directory of another user's, or
//! one users outside its group may write to, is not used at all (its group's members
//! are trusted as its owner is). All of it is blocking I/O: the registry actor runs it on a blocking
//! thread.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{CacheKey, Entry, json_size, now_ms};
use crate::util::hash::sha256_hex;

/// The largest cache file read: four times the largest message a transport takes.
const MAX_FILE: u64 = 64 << 20;

/// Whether `path` is a directory of this user's that others may not write to (group
/// members may: a user's private group is common), and, unless `configured` (the
/// operator named it, perhaps through a link), not a link: else another user could
/// plant links or entries in it.
fn private_dir(path: &Path, configured: bool) -> bool {
    let meta = match configured {
        true => std::fs::metadata(path),
        false => std::fs::symlink_metadata(path),
    };
    match meta {
        // SAFETY: geteuid has no preconditions and cannot fail.
        Ok(m) => m.is_dir() && m.uid() == unsafe { libc::geteuid() } && m.mode() & 0o002 == 0,
        Err(_) => false,
    }
}

/// A cache directory fit to use: the configured one, or a server's under it (see
/// [`private_dir`]).
fn usable(path: &Path, configured: bool) -> bool {
    private_dir(path, configured)
}

/// Makes the configured directory if it is not there; whether the disk layer may use
/// it (a refusal is logged here, once).
pub(super) fn prepare(dir: &Path) -> bool {
    if let Err(e) = crate::util::private_dirs(dir) {
        tracing::warn!(path = %dir.display(), error = %e, "cache directory cannot be made; the disk layer is off");
        return false;
    }
    let ok = usable(dir, true);
    if !ok {
        tracing::warn!(path = %dir.display(), "cache directory not this user's, or writable by users outside its group; the disk layer is off");
    }
    ok
}

/// Temporary files older than this are a crashed writer's, and removed.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(60);

/// The file name an entry with `key` must have.
fn file_name(key: &CacheKey) -> String {
    format!(
        "{}.json",
        sha256_hex(serde_json::to_string(key).unwrap_or_default().as_bytes())
    )
}

/// Whether a file name is one this layer makes: 64 lowercase hex digits (a key's
/// hash), then `.json`, or `.N.tmp` while it is written.
pub(super) fn ours(name: &str) -> bool {
    let (Some(hash), Some(rest)) = (name.get(..64), name.get(64..)) else {
        return false;
    };
    hash.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && (rest == ".json"
            || rest
                .strip_prefix('.')
                .and_then(|r| r.strip_suffix(".tmp"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
}

/// Writes one entry.
pub(super) fn write(dir: &Path, entry: &Entry) -> std::io::Result<()> {
    let server_dir = dir.join(&entry.key.server);
    crate::util::private_dirs(&server_dir)?;
    if !usable(&server_dir, false) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the cache directory is a link, not this user's, or writable by others",
        ));
    }
    write_private(
        &server_dir.join(file_name(&entry.key)),
        &serde_json::to_vec(entry)?,
    )
}

/// Removes the temporary files of a crashed writer in `dir` whose names start with
/// `prefix` (see [`write_private`]).
pub(super) fn remove_stale_tmp(dir: &Path, prefix: &str) {
    let Ok(files) = std::fs::read_dir(dir) else {
        return;
    };
    for file in files.flatten() {
        let name = file.file_name();
        let ours = name
            .to_str()
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".tmp"));
        let stale = file.metadata().is_ok_and(|m| {
            m.is_file()
                && m.modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_TMP)
        });
        if ours && stale {
            let _ = std::fs::remove_file(file.path());
        }
    }
}

/// An exclusive advisory lock (`flock`) on `path`, made 0600 if it is not there, held
/// until the file returned is dropped; waits for another process holding it until
/// `deadline`, and is a `TimedOut` error past it.
pub(super) fn locked_until(
    path: &Path,
    deadline: std::time::Instant,
) -> std::io::Result<std::fs::File> {
    let file = crate::util::lock::open(path)?;
    if !crate::util::lock::exclusive_until(&file, deadline)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "another process holds the lock",
        ));
    }
    Ok(file)
}

/// Writes `bytes` to `path` (0600) whole or not at all: to a temporary file of a random
/// name beside it (created, never reused), then renamed over it.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_replacing(path, bytes, false)
}

/// [`write_private`], on the disk when it returns: the file synced before the rename
/// and its directory after it, so that a crash leaves the old file or the new one, never
/// an empty one (the shared cache's floors: one lost would let a rollback in).
pub(super) fn write_durable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_replacing(path, bytes, true)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn write_replacing(path: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = path.with_extension(format!("{}.tmp", u64::from_le_bytes(nonce)));
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| if durable { file.sync_data() } else { Ok(()) });
    drop(file);
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The removal of one entry's file (evicted to keep the layer within its budget).
pub(super) fn remove(dir: &Path, key: &CacheKey) {
    let server_dir = dir.join(&key.server);
    if usable(&server_dir, false) {
        let _ = std::fs::remove_file(server_dir.join(file_name(key)));
    }
}

/// Removes every entry of `server`: the files of the names this layer makes, and the
/// folder once it is empty. Whatever else is there is left alone: the folder may be
/// another program's of the same name (a `cache.dir` of `~/.cache` and a server named
/// `pip`), and a link in its place is neither followed nor removed.
pub(super) fn remove_server(dir: &Path, server: &str) {
    let server_dir = dir.join(server);
    if !usable(&server_dir, false) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(&server_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let plain = entry.file_type().is_ok_and(|t| t.is_file());
        if plain && entry.file_name().to_str().is_some_and(ours) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    // Fails, as it should, while anything else is in it.
    let _ = std::fs::remove_dir(&server_dir);
}

/// A plain file's bytes, read without following a link or waiting on a pipe, and at
/// most [`MAX_FILE`] of them; `None` for anything else.
fn read_plain(path: &Path) -> Option<Vec<u8>> {
    read_plain_within(path, MAX_FILE)
}

/// [`read_plain`], for a file of at most `max` bytes.
pub(super) fn read_plain_within(path: &Path, max: u64) -> Option<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > max {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Removes the entries of `server` whose keys `drop` picks, reading one file at a time
/// (a server's files together may be as large as the layer's budget).
pub(super) fn remove_where(
    dir: &Path,
    server: &str,
    known: &[(CacheKey, bool)],
    drop: impl Fn(&CacheKey) -> bool,
) {
    // The files of the keys the index holds are named by them: removed unread. Only a
    // file the index does not know (another process's, or one past the budget at load)
    // is read to find its key; a full read of a server's files (each up to 64 MiB) at
    // every cursor a server refuses would hold the registry's one actor.
    let known: std::collections::HashMap<String, bool> = known
        .iter()
        .map(|(key, dropped)| (file_name(key), *dropped))
        .collect();
    for file in list_server(&dir.join(server)) {
        let name = file.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let doomed = match known.get(name) {
            Some(dropped) => *dropped,
            None => read_entry(&file.path, server).is_some_and(|e| drop(&e.key)),
        };
        if doomed {
            let _ = std::fs::remove_file(file.path);
        }
    }
}

/// One of a server's entry files, not read yet.
struct Listed {
    path: PathBuf,
    /// Its length in bytes.
    len: u64,
    modified: std::time::SystemTime,
}

/// `server`'s entry files (plain files of the names this layer makes), nothing read;
/// stale temporary files are removed on the way.
fn list_server(server_dir: &Path) -> Vec<Listed> {
    let mut out = Vec::new();
    if !usable(server_dir, false) {
        if std::fs::symlink_metadata(server_dir).is_ok() {
            tracing::warn!(path = %server_dir.display(), "cache directory not used: a link, not this user's, or writable by others");
        }
        return out;
    }
    let Ok(files) = std::fs::read_dir(server_dir) else {
        return out;
    };
    for file in files.flatten() {
        let path = file.path();
        // Only names this layer makes (a key's hash, then `.json` or a temporary
        // suffix) are read or removed: anything else there is not its own.
        if !file.file_name().to_str().is_some_and(ours) {
            continue;
        }
        // The entry's own type (a link is a link here): only plain files are read or
        // removed.
        let plain = file.file_type().is_ok_and(|t| t.is_file());
        let meta = file.metadata().ok();
        let modified = meta.as_ref().and_then(|m| m.modified().ok());
        if plain
            && path.extension().is_some_and(|e| e == "tmp")
            && modified
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP)
        {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        if !plain {
            tracing::warn!(path = %path.display(), "ignoring a cache entry that is not a plain file");
            continue;
        }
        out.push(Listed {
            path,
            len: meta.map_or(0, |m| m.len()),
            modified: modified.unwrap_or(std::time::UNIX_EPOCH),
        });
    }
    out
}

#[cfg(test)]
thread_local! {
    /// Entry files read on this thread (what a test of the budget counts).
    pub(super) static FILES_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The entry in `path`, a file of `server`'s; one whose name is not the hash of its key
/// is removed.
fn read_entry(path: &Path, server: &str) -> Option<Entry> {
    #[cfg(test)]
    FILES_READ.with(|n| n.set(n.get() + 1));
    // What cannot be read now (too large, swapped for a link, out of descriptors)
    // is skipped, not removed: only what was read and is not an entry goes.
    let Some(bytes) = read_plain(path) else {
        tracing::warn!(path = %path.display(), "ignoring a cache file that cannot be read whole");
        return None;
    };
    match serde_json::from_slice::<Entry>(&bytes) {
        Ok(e)
            if e.key.server == server
                && path.file_name().and_then(|n| n.to_str())
                    == Some(file_name(&e.key).as_str()) =>
        {
            Some(e)
        }
        _ => {
            tracing::warn!(path = %path.display(), "ignoring a cache file whose name is not the hash of its key");
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// Reads the fresh entries under `dir`, newest first, as long as they fit in
/// `max_bytes`: a file past it is removed unread, so what loading holds follows the
/// budget, not the directory (which processes sharing it, or a larger budget before,
/// may have filled). Expired and untrustworthy files are removed, and every file of a
/// server `skip` names (another process may have invalidated it while this one was
/// down). What a file says of itself is held to the rules a fresh page follows: fresh
/// for at most `max_ttl` from now, its size counted again.
pub(super) fn load(
    dir: &Path,
    max_ttl: Duration,
    max_bytes: usize,
    skip: impl Fn(&str) -> bool,
) -> HashMap<CacheKey, Entry> {
    let now = now_ms();
    let mut entries = HashMap::new();
    let Ok(servers) = std::fs::read_dir(dir) else {
        return entries;
    };
    let mut listed = Vec::new();
    for server in servers.flatten() {
        let Some(name) = server.file_name().to_str().map(String::from) else {
            continue;
        };
        if crate::server::check_id(&name).is_err() || !server.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        let files = list_server(&server.path());
        if skip(&name) {
            for f in files {
                let _ = std::fs::remove_file(f.path);
            }
            continue;
        }
        listed.extend(files.into_iter().map(|f| (name.clone(), f)));
    }
    listed.sort_unstable_by_key(|(_, f)| std::cmp::Reverse(f.modified));
    let latest = now.saturating_add(max_ttl.as_millis() as u64);
    let mut left = max_bytes;
    for (server, file) in listed {
        // A file holds its page and its key's strings, so with the entry's overhead its
        // length is about what the entry will cost (a hand-made file may count for more
        // once read; `left` takes its real cost, and the caller trims what is over): one
        // that cannot fit is not read.
        let most = usize::try_from(file.len)
            .unwrap_or(usize::MAX)
            .saturating_add(super::ENTRY_OVERHEAD);
        if most > left {
            let _ = std::fs::remove_file(&file.path);
            continue;
        }
        let Some(mut entry) = read_entry(&file.path, &server) else {
            continue;
        };
        if entry.expires_unix_ms <= now {
            let _ = std::fs::remove_file(&file.path);
            continue;
        }
        entry.expires_unix_ms = entry.expires_unix_ms.min(latest);
        entry.ttl_ms = entry.ttl_ms.min(max_ttl.as_millis() as u64);
        entry.bytes = json_size(&entry.value);
        entry.held = super::held_size(&entry.value);
        left = left.saturating_sub(entry.cost());
        entries.insert(entry.key.clone(), entry);
    }
    entries
}
