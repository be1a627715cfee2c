//! Keys in files. A secret an operator hands the harness (the shared cache's key): read
//! whole and bounded, and refused when others could change or read it. A key the
//! harness makes for itself and keeps (the audit trail's, the disk cache's): made once
//! by whichever process comes first, and used only if this user made it for this.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The longest secret file read.
const MAX_SECRET_FILE: u64 = 4096;

/// The secret in `path`: its bytes without surrounding whitespace (a key made with
/// `openssl rand -base64 32` is a line of text). Refused, with why: not a regular file
/// (a link is followed: mounted secrets are links), owned by a user other than this
/// one or root, writable by its group or by others, readable by others, over 4 KiB, or
/// under `min` bytes once trimmed.
pub fn read_secret_file(path: &Path, min: usize) -> Result<Vec<u8>, String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    // Looked at before it is opened (opening a device can do something), and again
    // through the open file, which must be the same one.
    let before = std::fs::metadata(path).map_err(fail)?;
    if !before.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    if !meta.is_file() || (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(format!("{}: changed while it was read", path.display()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "{}: owned by another user (uid {}); it must be this user's or root's",
            path.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode();
    if mode & 0o022 != 0 {
        return Err(format!(
            "{}: writable by its group or by others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    if mode & 0o004 != 0 {
        return Err(format!(
            "{}: readable by others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    if meta.len() > MAX_SECRET_FILE {
        return Err(format!(
            "{}: {} bytes, more than a key file holds ({MAX_SECRET_FILE})",
            path.display(),
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let secret = bytes.trim_ascii();
    if secret.len() < min {
        return Err(format!(
            "{}: {} bytes, fewer than {min} (make one with `openssl rand -base64 32`)",
            path.display(),
            secret.len()
        ));
    }
    Ok(secret.to_vec())
}

/// A fresh random key of 32 bytes (for this process only).
pub fn random_key() -> Vec<u8> {
    os_random_key().unwrap_or_else(|| {
        tracing::error!("no OS randomness for a key; using a per-process fallback");
        crate::util::hash::sha256_hex(format!("{:?}", std::time::SystemTime::now()).as_bytes())
            .into_bytes()
    })
}

/// 32 bytes from the operating system's generator, if it gives them.
fn os_random_key() -> Option<Vec<u8>> {
    let mut key = vec![0u8; 32];
    getrandom::fill(&mut key).ok().map(|()| key)
}

/// Opens a file this process keeps for itself: `None` when there is none; an error when
/// it is a link (not followed), not a plain file (a FIFO is not waited on), another
/// user's, or readable or writable by others.
pub(crate) fn open_private(
    path: &Path,
) -> Result<Option<(std::fs::File, std::fs::Metadata)>, String> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("a link, which is not followed".into());
        }
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let meta = checked_private(&file)?;
    Ok(Some((file, meta)))
}

/// The metadata of an open file, if it is a plain file of this user's that no one else
/// may read or write.
pub(crate) fn checked_private(file: &std::fs::File) -> Result<std::fs::Metadata, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(
            "not a plain file of this user's that no one else may read or write; not used".into(),
        );
    }
    Ok(meta)
}

/// Reads a kept key: `None` when there is none; an error when it is there but not one
/// this user made for this: a link, not a plain file, another user's, readable or
/// writable by others, or not 32 to 64 bytes.
fn read_local_key(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let Some((file, meta)) = open_private(path)? else {
        return Ok(None);
    };
    if !(32..=64).contains(&meta.len()) {
        return Err(format!("{} bytes, not 32 to 64", meta.len()));
    }
    let mut key = Vec::with_capacity(64);
    file.take(64)
        .read_to_end(&mut key)
        .map_err(|e| e.to_string())?;
    Ok(Some(key))
}

/// The key kept at `path` (0600, 32 random bytes), made now if there is none; `what`
/// names it in logs. A file there that this user did not make for this is left in
/// place and a key for this process alone is used (what it protects then does not
/// survive a restart); so is one that cannot be written.
pub fn local_key(path: &Path, what: &str) -> Vec<u8> {
    match read_local_key(path) {
        Ok(Some(key)) => return key,
        Ok(None) => {}
        Err(why) => {
            // Not replaced: it may be someone's planted file, or the operator's.
            tracing::error!(path = %path.display(), %why, what, "key file not used; a key for this process only");
            return random_key();
        }
    }
    // The fallback (a clock reading) is guessable: good enough for one process's
    // run, never kept for every later one.
    let Some(key) = os_random_key() else {
        return random_key();
    };
    // Written whole under a name of its own, then linked into place: the key file
    // appears complete or not at all, and a process that finds it made first reads
    // all of it.
    let mut nonce = [0u8; 8];
    let _ = getrandom::fill(&mut nonce);
    // Its bytes, not as displayed: a directory whose name is not UTF-8 is the same one.
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".{}.tmp", u64::from_le_bytes(nonce)));
    let tmp = PathBuf::from(tmp);
    let written = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or(Ok(()), super::private_dirs)
        .and_then(|()| {
            // Never through a link, never over another file.
            std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)
        })
        .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Another process made it first: its key is the one to share.
            match read_local_key(path) {
                Ok(Some(theirs)) => return theirs,
                _ => {
                    tracing::warn!(path = %path.display(), what, "another key file appeared and cannot be used; a key for this process only")
                }
            }
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, what, "could not keep the key; a key for this process only");
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    // A key under a directory whose name is not UTF-8 is kept there like any other:
    // the second reading finds the first's.
    #[test]
    fn a_key_under_a_directory_named_in_other_bytes_is_kept() {
        use std::os::unix::ffi::OsStrExt;
        let dir = crate::util::scratch::Scratch::new("key-bytes");
        let path = dir
            .join(std::ffi::OsStr::from_bytes(b"d\xff"))
            .join("audit.jsonl.key");
        let first = local_key(&path, "test");
        assert!(path.exists(), "kept");
        assert_eq!(local_key(&path, "test"), first);
    }

    #[test]
    fn a_secret_file_is_trimmed_and_refused_when_others_could_read_or_change_it() {
        let dir = crate::util::scratch::Scratch::new("secret");
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("key");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        let key = "0123456789abcdef0123456789abcdef0123456789ab";
        write(&format!("{key}\n"), 0o600);
        assert_eq!(read_secret_file(&path, 32), Ok(key.as_bytes().to_vec()));
        write(key, 0o440);
        assert!(
            read_secret_file(&path, 32).is_ok(),
            "group-readable is allowed"
        );
        for mode in [0o644, 0o604, 0o620, 0o602] {
            write(key, mode);
            let e = read_secret_file(&path, 32).expect_err("refused");
            assert!(e.contains("chmod 600"), "{mode:o}: {e}");
        }
        write("  short\n", 0o600);
        assert!(
            read_secret_file(&path, 32)
                .expect_err("short")
                .contains("fewer than 32")
        );
        write(&"k".repeat(5000), 0o600);
        assert!(
            read_secret_file(&path, 32)
                .expect_err("long")
                .contains("more than")
        );
        assert!(read_secret_file(&dir.join("absent"), 32).is_err());
        // A directory, and a FIFO (opened without blocking, then refused).
        assert!(
            read_secret_file(&dir.join(""), 32)
                .expect_err("dir")
                .contains("regular")
        );
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).expect("path");
        // SAFETY: mkfifo reads the NUL-terminated path and nothing else.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(
            read_secret_file(&fifo, 32)
                .expect_err("fifo")
                .contains("regular")
        );
        // Another user's file (only root can make one here).
        write(key, 0o600);
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).expect("path");
            // SAFETY: chown reads the NUL-terminated path and nothing else.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
            let e = read_secret_file(&path, 32).expect_err("another user's");
            assert!(e.contains("owned by another user"), "{e}");
        }
    }
}
