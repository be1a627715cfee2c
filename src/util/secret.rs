//! A secret an operator hands the harness in a file (the shared cache's key): read
//! whole and bounded, and refused when others could change or read it.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The longest secret file read.
const MAX_SECRET_FILE: u64 = 4096;

/// The secret in `path`: its bytes without surrounding whitespace (a key made with
/// `openssl rand -base64 32` is a line of text). Refused, with why: not a regular file
/// (a link is followed: mounted secrets are links), writable by its group or by others,
/// readable by others, over 4 KiB, or under `min` bytes once trimmed.
pub fn read_secret_file(path: &Path, min: usize) -> Result<Vec<u8>, String> {
    // Opened first and checked through the open file, so that what is checked is what
    // is read; O_NONBLOCK, so that a FIFO planted there cannot hang the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
    }
}
