//! Advisory locks (`flock`) on a lock file that processes sharing a directory take in
//! turn (a token's renewal, the shared cache's generation floors).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens the lock file `path`, made 0600 if it is not there; a link is not followed,
/// nor a FIFO waited on.
pub fn open(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Takes the exclusive lock on `file` (released when it is closed), waiting for another
/// holder until `deadline`: `Ok(false)` if one still holds it then. A process stopped
/// or stuck on a disk while it holds the lock holds no one past the deadline.
pub fn exclusive_until(file: &File, deadline: std::time::Instant) -> std::io::Result<bool> {
    loop {
        if exclusive(file, false)? {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
    }
}

/// Takes the exclusive lock on `file`, released when it is closed: `Ok(false)` if
/// another holds it and `wait` is not set, else waits for it.
pub fn exclusive(file: &File, wait: bool) -> std::io::Result<bool> {
    let mode = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // (`File::lock` would do, from Rust 1.89; the crate supports 1.88.)
    // SAFETY: the descriptor stays open for the call (the file is borrowed).
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(file), mode) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) if !wait => Ok(false),
        _ => Err(e),
    }
}
