//! The audit file: JSON Lines appended in batches, never a torn or doubled record.
//!
//! The writer remembers the offset after the last batch that was written whole. A write
//! that fails part-way is cut back to that offset, so a partial batch never stays in
//! the file and the retry writes it once. The offset is read again before each batch,
//! so a file cut by someone else (`logrotate`'s `copytruncate`) is never padded back
//! to its old length. A file removed or renamed away (`logrotate`'s default) is
//! noticed before the next batch, which goes to a new file at the path: records are
//! never written on into a file nobody can find. A pipe with no reader fails to open
//! rather than block the writer. The file is created 0600. Several processes of the
//! harness may append to one file (a gateway and the command line's calls, from one
//! config): each holds an advisory lock (`flock`) from reading the length through the
//! append and any cut, so that no cut takes another's records. A file at the path that
//! is not this user's, that others may write, or a link that another user made, is
//! refused: the trail is not written where someone else owns or edits it. One every
//! user may read (made by another tool, `0644`) is used, with a warning.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where batches go: the file, or a stand-in in unit tests.
pub(super) trait Output: Send {
    /// Appends `bytes` at the end; on failure, how many of them were written before it.
    fn append(&mut self, bytes: &[u8]) -> Result<(), (usize, std::io::Error)>;
    /// Cuts the output back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
    /// Its length now.
    fn len(&mut self) -> std::io::Result<u64>;
    /// The byte at `offset`, where it can be read back (`None`: a pipe, say).
    fn byte_at(&mut self, _offset: u64) -> Option<u8> {
        None
    }
    /// Whether its path names another file now, or none (removed, renamed away).
    fn moved(&mut self) -> bool {
        false
    }
    /// Whether the file is gone from every directory (removed, not renamed): what was
    /// written to it goes when it is closed.
    fn removed(&mut self) -> bool {
        false
    }
    /// Flushes what it holds to the disk.
    fn sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    /// Whether it is a regular file (what was written there stays to be read; a pipe's
    /// reader may have gone without reading it).
    fn is_file(&mut self) -> bool {
        false
    }
    /// Holds off other processes' writers of the same file until [`Output::unlock`]
    /// (or until it is closed).
    fn lock(&mut self) {}
    /// Lets them write again.
    fn unlock(&mut self) {}
}

struct FileOutput {
    file: std::fs::File,
    path: PathBuf,
    /// A copy of this process's own stdout or stderr ([`own_stream`]): never moved
    /// away (its path names the descriptor, through `/proc`, which may be absent).
    own: bool,
    /// The process's own stream its path names, however it was opened (a pipe opened
    /// again by name too): its writes hold that stream's [`own_output`] lock.
    stream: Option<OwnStream>,
}

impl FileOutput {
    fn new(file: std::fs::File, path: PathBuf, own: bool) -> FileOutput {
        let stream = path.to_str().and_then(|p| {
            if STDOUT_PATHS.contains(&p) {
                Some(OwnStream::Stdout)
            } else if STDERR_PATHS.contains(&p) {
                Some(OwnStream::Stderr)
            } else {
                None
            }
        });
        FileOutput {
            file,
            path,
            own,
            stream,
        }
    }
}

impl Output for FileOutput {
    fn is_file(&mut self) -> bool {
        self.file.metadata().is_ok_and(|m| m.is_file())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        match self.file.sync_data() {
            // A pipe or a terminal has no disk to reach.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            other => other,
        }
    }
    fn byte_at(&mut self, offset: u64) -> Option<u8> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        // The file is open for appending only (opening a pipe to read too would never
        // fail for want of a reader): a regular file is read through a descriptor of
        // its own, on the same file whatever its path names now.
        if !self.file.metadata().is_ok_and(|m| m.is_file()) {
            return None;
        }
        let reader =
            std::fs::File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd())).ok()?;
        let mut byte = [0u8];
        match reader.read_at(&mut byte, offset) {
            Ok(1) => Some(byte[0]),
            _ => None,
        }
    }
    fn moved(&mut self) -> bool {
        use std::os::unix::fs::MetadataExt;
        if self.own {
            return false;
        }
        let (Ok(now), Ok(open)) = (std::fs::metadata(&self.path), self.file.metadata()) else {
            return true;
        };
        (now.dev(), now.ino()) != (open.dev(), open.ino())
    }

    fn removed(&mut self) -> bool {
        use std::os::unix::fs::MetadataExt;
        !self.own && self.file.metadata().is_ok_and(|m| m.nlink() == 0)
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), (usize, std::io::Error)> {
        // This process's other writers of the same stream wait for the whole batch.
        let _alone = self.stream.map(own_output);
        // `write_all`, counting: a failure says how much went out before it.
        let mut written = 0;
        while written < bytes.len() {
            match self.file.write(&bytes[written..]) {
                Ok(0) => {
                    let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Err((written, e));
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A copy of a descriptor this process was given set non-blocking
                // ([`own_stream`]): waited on, as a blocking write would wait.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    use std::os::fd::AsRawFd;
                    let mut ready = libc::pollfd {
                        fd: self.file.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one pollfd owned here, for a descriptor this output owns.
                    if unsafe { libc::poll(&mut ready, 1, -1) } < 0 {
                        let e = std::io::Error::last_os_error();
                        if e.kind() != std::io::ErrorKind::Interrupted {
                            return Err((written, e));
                        }
                    }
                }
                Err(e) => return Err((written, e)),
            }
        }
        self.file.flush().map_err(|e| (written, e))
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn lock(&mut self) {
        use std::os::fd::AsRawFd;
        // Best effort: a pipe or a terminal has no other writer to hold off.
        // SAFETY: flock on a descriptor this output owns; no pointers.
        let _ = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX) };
    }
    fn unlock(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in `lock`.
        let _ = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
    fn len(&mut self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

/// Opens outputs: the real file, or a test's stand-in.
pub(super) type Opener = Box<dyn FnMut() -> std::io::Result<Box<dyn Output>> + Send>;

/// An opener for the audit file at `path` (created 0600, with its directory).
pub(super) fn file_opener(path: PathBuf) -> Opener {
    let mut warned = false;
    Box::new(move || {
        let output =
            |file, own| Box::new(FileOutput::new(file, path.clone(), own)) as Box<dyn Output>;
        let file = match own_stream(&path)? {
            Some(Own::Shared(file)) => return Ok(output(file, true)),
            Some(Own::Named(copy)) => match open_by_name(&path, &mut warned) {
                // A pipe or terminal another user owns (the harness dropped its
                // privileges, or runs after `su`) cannot be opened by name, nor any
                // without `/proc`: the descriptor it was given is written instead.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::EPERM | libc::ENOENT)
                    ) =>
                {
                    return Ok(output(copy, true));
                }
                opened => opened?,
            },
            None => open_by_name(&path, &mut warned)?,
        };
        Ok(output(file, false))
    })
}

/// Opens the audit file at `path` by its name, checked as [`file_opener`] says.
fn open_by_name(path: &Path, warned: &mut bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => {
            crate::util::private_dirs(parent)?;
            parent
        }
        None => Path::new("."),
    };
    if !*warned && let Some((dir, why)) = shared_dir(parent) {
        *warned = true;
        tracing::warn!(dir = %dir.display(), "{why}: anyone who can could remove or rename the audit trail there (give it a directory of this user's)");
    }
    // Non-blocking while it opens: a pipe with no reader fails at once (ENXIO)
    // instead of holding the writer, and every record behind it, until one comes.
    let open = |follow: bool| {
        let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NONBLOCK | nofollow)
            .open(path)
    };
    // Not following a link first: one planted between a check and the open (where
    // there was nothing) is not followed. A link that is there is checked, then
    // followed.
    let file = match open(false) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            refuse_planted_link(path)?;
            open(true)?
        }
        opened => opened?,
    };
    // Writes block again, as a pipe that is read (`/dev/stdout` in a container) needs.
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor this function owns; no pointers.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    refuse_others_file(&file, path)?;
    Ok(file)
}

/// This process's own stdout or stderr, as [`own_stream`] finds it.
enum Own {
    /// A regular file or a socket: written through this copy of its descriptor.
    Shared(std::fs::File),
    /// A pipe or a terminal: opened by name, and written through this copy only when
    /// it cannot be.
    Named(std::fs::File),
}

/// This process's own output streams, which an audit trail may be written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnStream {
    /// `/dev/stdout`.
    Stdout,
    /// `/dev/stderr`.
    Stderr,
}

const STDOUT_PATHS: &[&str] = &["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"];
const STDERR_PATHS: &[&str] = &["/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"];

/// Held by this process's writers of its own `stream` while they write: an audit trail
/// written there, and a program's log and output writers that take it too (the
/// `mcp-harness` binary's do). A write of more than `PIPE_BUF` bytes to a pipe is not
/// atomic: a log line written meanwhile could land inside a record. One lock per
/// stream, so that a trail stuck on an unread stdout holds no log line on stderr.
/// Reentrant, so that what logs while holding it does not wait on itself.
pub fn own_output(stream: OwnStream) -> parking_lot::ReentrantMutexGuard<'static, ()> {
    static STDOUT: parking_lot::ReentrantMutex<()> = parking_lot::const_reentrant_mutex(());
    static STDERR: parking_lot::ReentrantMutex<()> = parking_lot::const_reentrant_mutex(());
    match stream {
        OwnStream::Stdout => STDOUT.lock(),
        OwnStream::Stderr => STDERR.lock(),
    }
}

/// This process's own stdout or stderr, when `path` names it. A regular file or a
/// socket is written through a copy of the descriptor, not opened again by name: opened
/// again, a redirected file (`> out.log`) would have an offset of its own, and what the
/// process prints there would overwrite the records written before; and a socket
/// (systemd's journal) cannot be opened by name at all. A regular file is then appended
/// to by both (O_APPEND is set on the description the process was given). A pipe or a
/// terminal is opened again by name where it can be: it has no offset, and a
/// description of its own keeps the writer blocking whatever the one inherited is set
/// to (a copy set non-blocking is waited on in [`FileOutput::append`]).
fn own_stream(path: &Path) -> std::io::Result<Option<Own>> {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::FileTypeExt;
    let fd = match path.to_str() {
        Some(p) if STDOUT_PATHS.contains(&p) => std::io::stdout().as_fd().try_clone_to_owned()?,
        Some(p) if STDERR_PATHS.contains(&p) => std::io::stderr().as_fd().try_clone_to_owned()?,
        _ => return Ok(None),
    };
    let file = std::fs::File::from(fd);
    let kind = file.metadata()?.file_type();
    if kind.is_socket() {
        return Ok(Some(Own::Shared(file)));
    }
    if !kind.is_file() {
        return Ok(Some(Own::Named(file)));
    }
    {
        let raw = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor this function owns; no pointers.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_APPEND) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(Some(Own::Shared(file)))
}

/// Which directory on the way to the trail lets others remove or replace it, and why,
/// if one does: the trail's own, or one above it (which could rename the trail's
/// directory away), is neither this user's nor root's, or every user (or, for one not
/// root's, its group) may write to it and it is not sticky (as `/tmp` is). The
/// directories the harness creates are this user's alone. Warned of, not refused: a volume mounted that
/// way (a Kubernetes `emptyDir` is 0777; a host directory bind-mounted into a container
/// keeps the host's owner) is how many deployments keep their logs.
fn shared_dir(dir: &Path) -> Option<(std::path::PathBuf, &'static str)> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    let why = |d: &Path| {
        let m = std::fs::metadata(d).ok()?;
        dir_risk(m.mode(), m.uid(), me)
    };
    // The path as written (a link on it another user could replace counts) and where
    // it leads.
    let written = std::path::absolute(dir).ok()?;
    let real = std::fs::canonicalize(dir).ok()?;
    written
        .ancestors()
        .chain(real.ancestors())
        .find_map(|d| why(d).map(|why| (d.to_path_buf(), why)))
}

/// Why a directory of `mode` owned by `uid` lets others remove or replace what is in
/// it, for a process of user `me` (see [`shared_dir`]).
fn dir_risk(mode: u32, uid: u32, me: u32) -> Option<&'static str> {
    if uid != me && uid != 0 {
        return Some("a directory on the way to the audit file belongs to another user");
    }
    if mode & 0o1000 != 0 {
        return None;
    }
    if mode & 0o002 != 0 {
        return Some(
            "a directory on the way to the audit file may be written by every user and is not sticky",
        );
    }
    // Root's own group-writable directories are the system's layout (`/var/log` of
    // group `syslog`), not warned of.
    if mode & 0o020 != 0 && uid != 0 {
        return Some(
            "a directory on the way to the audit file may be written by its group and is not sticky",
        );
    }
    None
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string())
}

/// A link at the path made by another user (in a shared directory such as `/tmp`) is
/// refused: it would have the trail appended wherever that user chose. A link of this
/// user's or of root's (`/dev/stdout`) is followed.
fn refuse_planted_link(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            // SAFETY: geteuid has no arguments and cannot fail.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me && m.uid() != 0 {
                return Err(refused(
                    "the audit path is a link another user made; refusing to follow it",
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A file or FIFO at the path must be this user's, and a file must not be writable by
/// others: the trail is not kept where someone else owns or edits it (one every user
/// may read is used, with a warning). Devices (a
/// terminal, `/dev/null`) and pipes this process was given are taken as they are.
fn refuse_others_file(file: &std::fs::File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = file.metadata()?;
    let kind = m.file_type();
    if !(kind.is_file() || kind.is_fifo()) {
        return Ok(());
    }
    // This process's own stdout or stderr (`/dev/stdout` redirected to a file that
    // systemd made as root, say) is where it was told to write.
    let inherited = ["/proc/self/fd/1", "/proc/self/fd/2"]
        .iter()
        .any(|fd| std::fs::metadata(fd).is_ok_and(|o| (o.dev(), o.ino()) == (m.dev(), m.ino())));
    if inherited {
        return Ok(());
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        // A pipe this process inherited (`/dev/stdout` under a supervisor) is on no
        // file system of a directory; a named one planted in a shared directory is.
        let dir_dev = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|d| d.dev());
        if kind.is_fifo() && dir_dev != Some(m.dev()) {
            return Ok(());
        }
        return Err(refused("the audit file belongs to another user"));
    }
    if kind.is_file() && m.mode() & 0o022 != 0 {
        return Err(refused(
            "the audit file may be written by others (group or world writable)",
        ));
    }
    if kind.is_file() && m.mode() & 0o004 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", m.mode() & 0o777), "the audit file may be read by every user: its records name agents, tools and arguments (as redaction keeps them)");
    }
    Ok(())
}

/// The writer: an output opened on demand (and again after a failure), and the offset
/// of the last whole batch.
pub(super) struct AuditFile {
    open: Opener,
    output: Option<Box<dyn Output>>,
    /// The length after the last batch written whole; `None` until first opened.
    good: Option<u64>,
    /// The length after a torn write that could not be cut back: cut when the file is
    /// next opened, if it still has that length (no other process wrote since).
    torn: Option<u64>,
    /// A sync that failed on an output let go of (a failed write, a file moved away):
    /// the next [`AuditFile::sync`] reports it, so that the records written there are
    /// not counted as on the disk.
    lost_sync: Option<std::io::Error>,
}

impl AuditFile {
    pub(super) fn new(open: Opener) -> AuditFile {
        AuditFile {
            open,
            output: None,
            good: None,
            torn: None,
            lost_sync: None,
        }
    }

    /// Lets go of the output, synced first (its records reach the disk, or the next
    /// sync says they may not have).
    fn close_output(&mut self) {
        if let Some(mut output) = self.output.take()
            && let Err(e) = output.sync()
        {
            tracing::warn!(error = %e, "could not sync the audit file let go of");
            self.lost_sync.get_or_insert(e);
        }
    }

    /// Whether the output is open now.
    pub(super) fn is_open(&self) -> bool {
        self.output.is_some()
    }

    /// Flushes the open file to the disk (nothing when none is open); fails too when a
    /// file let go of since the last sync could not be synced.
    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        if let Some(e) = self.lost_sync.take() {
            return Err(e);
        }
        match self.output.as_mut() {
            Some(output) => output.sync(),
            None => Ok(()),
        }
    }

    /// Opens the output if it is not open (or was moved away): at start, so that a file
    /// that cannot be opened fails the trail before the first call, and before a batch.
    pub(super) fn ensure_open(&mut self) -> std::io::Result<()> {
        if self.output.as_mut().is_some_and(|o| o.moved()) {
            // Removed or rotated away: the batches before stay where they are (synced
            // there first: the sync after this batch reaches only the new file), and the
            // next one starts the file now at the path.
            // Rotated away is routine; removed, the trail up to now is gone with it.
            match self.output.as_mut().is_some_and(|o| o.removed()) {
                true => tracing::warn!(
                    "audit file removed (its records with it); writing to a new one at its path"
                ),
                false => tracing::info!("audit file moved; writing to a new one at its path"),
            }
            self.close_output();
            self.good = None;
        }
        if self.output.is_none() {
            // Closing the output (returning early) lets go of its lock.
            let mut output = (self.open)()?;
            output.lock();
            let len = output.len()?;
            // Reopened after a failure whose cut did not happen: cut now, unless another
            // process wrote since (its records are not ours to cut).
            if let (Some(good), Some(torn)) = (self.good, self.torn.take())
                && len == torn
                && len > good
                && output.truncate(good).is_err()
            {
                // Tried once more, not at every open (an append-only file would stop
                // the trail for good): the torn record stays, ended with a newline
                // before the next batch.
                tracing::warn!(
                    "could not cut the audit file back at its reopening either; the torn record stays on a line of its own"
                );
            }
            self.good.get_or_insert(len);
            output.unlock();
            self.output = Some(output);
        }
        Ok(())
    }

    /// Appends one batch, all of it or (after cutting back a partial write) none of it;
    /// when the cut fails, its whole records written before the failure stay
    /// ([`WriteFailed::kept`]).
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), WriteFailed> {
        let failed = |error| WriteFailed { error, kept: 0 };
        self.ensure_open().map_err(failed)?;
        let Some(output) = self.output.as_mut() else {
            return Err(failed(std::io::Error::other("audit output not open")));
        };
        output.lock();
        // Where this batch starts: the file as it is now (another hand may have cut
        // it, another process appended to it), which the batch before left whole.
        let good = match output.len() {
            Ok(len) => len,
            Err(e) => {
                self.close_output();
                return Err(failed(e));
            }
        };
        self.good = Some(good);
        // A torn record left at the end (a cut that failed, here or in another
        // process) is ended first, so that it does not run into this batch's first.
        let end = good > 0 && output.byte_at(good - 1).is_some_and(|b| b != b'\n');
        let appended = match end {
            true => output
                .append(b"\n")
                .map_err(|(_, e)| (0, e))
                .and_then(|()| output.append(bytes)),
            false => output.append(bytes),
        };
        match appended {
            Ok(()) => {
                output.unlock();
                self.good = Some(good + u64::from(end) + bytes.len() as u64);
                Ok(())
            }
            Err((written, error)) => {
                // A torn batch must not stay; if the cut fails too, the next open cuts.
                // A file shrunk meanwhile (cut by another hand) is not cut past its end,
                // which would pad it with zeros.
                let shrunk = output.len().is_ok_and(|len| len < good);
                if !shrunk && output.truncate(good).is_ok() {
                    self.close_output();
                    return Err(WriteFailed { error, kept: 0 });
                }
                if shrunk {
                    tracing::warn!(
                        "the audit file was cut by another hand during a failed write; its torn end is cut at the next open"
                    );
                } else {
                    tracing::warn!("could not cut the audit file back after a failed write");
                }
                // The batch's whole records before the torn one stay in a regular file
                // (append-only): they are not written again, and a cut at the next open
                // takes the torn one only (written twice, they broke "exactly one"). A
                // pipe's may never have been read (its reader went): written again.
                let whole = match written > 0 && output.is_file() {
                    true => bytes[..written.min(bytes.len())]
                        .iter()
                        .rposition(|b| *b == b'\n')
                        .map_or(0, |p| p + 1),
                    false => 0,
                };
                // (Some written: so was the newline before them.)
                let start = good + u64::from(end && whole > 0);
                self.good = Some(start + whole as u64);
                self.torn = output.len().ok();
                self.close_output();
                Err(WriteFailed { error, kept: whole })
            }
        }
    }
}

/// A batch that failed: why, and how many of its first bytes (whole records) are in
/// the file all the same, not to be written again.
#[derive(Debug)]
pub(super) struct WriteFailed {
    pub(super) error: std::io::Error,
    pub(super) kept: usize,
}

impl std::fmt::Display for WriteFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// The key of the audit trail's auth-context hashes, kept beside the audit file
/// (`PATH.key`, 0600): the same context hashes the same across restarts, and nobody
/// without the key can test a guess against a record. Without a file, a key per process.
pub(super) fn load_or_create_key(audit_path: Option<&Path>) -> Vec<u8> {
    match audit_path {
        Some(path) => {
            // Beside the path as it is (its bytes, not as displayed: a name that is no
            // UTF-8 would put the key elsewhere).
            let mut key = path.as_os_str().to_owned();
            key.push(".key");
            crate::util::secret::local_key(&PathBuf::from(key), "audit hash key")
        }
        None => crate::util::secret::random_key(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use parking_lot::Mutex;

    // A directory above the trail's that every user may write to (and is not sticky)
    // could rename the trail's own away: warned of too, by its name. Before, only the
    // trail's own directory was looked at.
    // A trail rotated away is told from one removed (its records gone with it, warned of).
    #[test]
    fn a_trail_moved_is_told_from_one_removed() {
        let scratch = crate::util::scratch::Scratch::new("audit-removed");
        std::fs::create_dir_all(&*scratch).expect("dir");
        let path = scratch.join("audit.jsonl");
        let open = || {
            FileOutput::new(
                std::fs::File::create(&path).expect("file"),
                path.clone(),
                false,
            )
        };
        let mut output = open();
        assert!(!output.moved() && !output.removed());
        std::fs::rename(&path, scratch.join("audit.jsonl.1")).expect("rotate");
        assert!(output.moved() && !output.removed(), "rotated");
        let mut output = open();
        std::fs::remove_file(&path).expect("remove");
        assert!(output.moved() && output.removed(), "removed");
    }

    #[test]
    fn a_shared_directory_above_the_trails_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = crate::util::scratch::Scratch::new("audit-ancestors");
        let open = scratch.join("open");
        let mine = open.join("mine");
        std::fs::create_dir_all(&mine).expect("dirs");
        for d in [&*scratch, &*open] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(shared_dir(&mine), None, "all this user's");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let (dir, why) = shared_dir(&mine).expect("the one above is shared");
        assert_eq!(dir, std::fs::canonicalize(&open).expect("canonical"));
        assert!(why.contains("not sticky"), "{why}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert_eq!(shared_dir(&mine), None, "sticky, as /tmp");
        // Its group may write to it (made under a umask of 002): named too, but for
        // root's own (the system's layout).
        assert!(dir_risk(0o40775, 1000, 1000).is_some_and(|w| w.contains("its group")));
        assert_eq!(dir_risk(0o41775, 1000, 1000), None, "sticky");
        assert_eq!(dir_risk(0o40775, 0, 1000), None, "root's");
        assert_eq!(dir_risk(0o40755, 1000, 1000), None, "this user's alone");
        assert!(dir_risk(0o40700, 1001, 1000).is_some_and(|w| w.contains("another user")));
        // What the harness creates is this user's alone, whatever the umask.
        let made = mine.join("a").join("b");
        crate::util::private_dirs(&made).expect("made");
        for d in [mine.join("a"), made] {
            let mode = std::fs::metadata(&d).expect("dir").permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        // A link on the way, in a directory every user may write: the link could be
        // replaced, wherever it leads now.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let real = scratch.join("real");
        std::fs::create_dir_all(&real).expect("dir");
        std::os::unix::fs::symlink(&real, open.join("link")).expect("link");
        let (dir, _) = shared_dir(&open.join("link")).expect("the link's directory is shared");
        assert_eq!(dir, std::path::absolute(&open).expect("absolute"));
    }

    // A copy of a descriptor set non-blocking (a socket a parent handed down so) takes
    // a batch larger than its buffer whole, waiting for the reader, not failing part-way
    // (which would tear the batch and write it again).
    #[test]
    fn a_non_blocking_socket_takes_a_large_batch_whole() {
        use std::io::Read;
        let (writer, mut reader) = std::os::unix::net::UnixStream::pair().expect("pair");
        writer.set_nonblocking(true).expect("non-blocking");
        let mut output = FileOutput::new(
            std::fs::File::from(std::os::fd::OwnedFd::from(writer)),
            PathBuf::from("/dev/stdout"),
            true,
        );
        let batch = vec![b'x'; 4 << 20];
        let read = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 64 << 10];
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return got.len(),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        let appended = output.append(&batch);
        assert!(appended.is_ok(), "{:?}", appended.err());
        drop(output);
        assert_eq!(read.join().expect("reader"), batch.len());
    }

    // A trail on this process's own stderr, a pipe, and a log line written to it while
    // a batch larger than the pipe goes out: the line comes between records, not
    // inside one (the batch's writer holds the stream's lock, which the binary's log
    // writer takes too). Before, the kernel let the line in when the pipe filled.
    #[test]
    fn a_log_line_on_the_same_stderr_waits_for_the_batch() {
        use std::io::{Read, Write};
        let (mut reader, writer) = std::io::pipe().expect("pipe");
        let mut logs = writer.try_clone().expect("clone");
        // A pipe is opened again by name (not the process's own descriptor): still
        // the process's stderr, and locked as it.
        let mut output = FileOutput::new(
            std::fs::File::from(std::os::fd::OwnedFd::from(writer)),
            PathBuf::from("/dev/stderr"),
            false,
        );
        let record = format!("{{\"r\":\"{}\"}}\n", "x".repeat(1000));
        let batch = record.repeat(1024);
        let (started, begun) = std::sync::mpsc::channel();
        let writing = std::thread::spawn(move || {
            let _ = started.send(());
            output
                .append(batch.as_bytes())
                .map_err(|(_, e)| e.to_string())
        });
        let logging = std::thread::spawn(move || {
            let _ = begun.recv();
            // The batch has begun and fills the pipe, which nobody reads yet.
            std::thread::sleep(std::time::Duration::from_millis(200));
            let _alone = own_output(OwnStream::Stderr);
            logs.write_all(b"LOG LINE\n").expect("log");
        });
        std::thread::sleep(std::time::Duration::from_millis(400));
        let mut read = String::new();
        let reading = std::thread::spawn(move || reader.read_to_string(&mut read).map(|_| read));
        writing.join().expect("writer").expect("appended");
        logging.join().expect("logger");
        let read = reading.join().expect("reader").expect("read");
        let lines: Vec<&str> = read.lines().collect();
        assert_eq!(lines.len(), 1025, "every record and the log line, whole");
        assert!(
            lines
                .iter()
                .all(|l| *l == "LOG LINE" || *l == record.trim_end()),
            "a line was torn"
        );
    }

    /// An output that writes into a shared buffer and fails as told: `fail_after`
    /// bytes of the next append are written, then an error.
    #[derive(Clone, Default)]
    struct Flaky {
        data: Arc<Mutex<Vec<u8>>>,
        fail_after: Arc<Mutex<Option<usize>>>,
        fail_opens: Arc<Mutex<usize>>,
        fail_truncate: Arc<Mutex<bool>>,
        /// The next failing append finds the file cut to nothing by another hand first.
        shrink_first: Arc<Mutex<bool>>,
        /// Syncs that fail from now.
        fail_syncs: Arc<Mutex<usize>>,
        /// The next look at the path finds another file there (once).
        moved: Arc<Mutex<bool>>,
    }

    impl Output for Flaky {
        fn append(&mut self, bytes: &[u8]) -> Result<(), (usize, std::io::Error)> {
            match self.fail_after.lock().take() {
                Some(n) => {
                    let n = n.min(bytes.len());
                    if std::mem::take(&mut *self.shrink_first.lock()) {
                        self.data.lock().clear();
                    }
                    self.data.lock().extend_from_slice(&bytes[..n]);
                    Err((n, std::io::Error::other("disk full")))
                }
                None => {
                    self.data.lock().extend_from_slice(bytes);
                    Ok(())
                }
            }
        }
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            if std::mem::take(&mut *self.fail_truncate.lock()) {
                return Err(std::io::Error::other("cannot cut"));
            }
            // As `set_len` does: longer pads with zeros.
            self.data.lock().resize(len as usize, 0);
            Ok(())
        }
        fn len(&mut self) -> std::io::Result<u64> {
            Ok(self.data.lock().len() as u64)
        }
        fn byte_at(&mut self, offset: u64) -> Option<u8> {
            self.data.lock().get(offset as usize).copied()
        }
        fn is_file(&mut self) -> bool {
            true
        }
        fn moved(&mut self) -> bool {
            std::mem::take(&mut *self.moved.lock())
        }
        fn sync(&mut self) -> std::io::Result<()> {
            let mut failing = self.fail_syncs.lock();
            if *failing > 0 {
                *failing -= 1;
                return Err(std::io::Error::other("EIO"));
            }
            Ok(())
        }
    }

    // A sync that failed fails the trail until a sync succeeds: tried again at the
    // next timer with nothing new written (`fail_closed` refuses the calls that would
    // write), and not healed by a write that reaches only the page cache.
    #[test]
    fn a_failed_sync_is_tried_again_and_only_a_sync_heals_it() {
        use crate::audit::{AuditConfig, AuditSink};
        let dir = crate::util::scratch::Scratch::new("failed-sync");
        let config = AuditConfig {
            path: Some(dir.join("audit.jsonl")),
            ..AuditConfig::default()
        };
        let flaky = Flaky::default();
        let slot = crate::util::slot::ActorSlot::default();
        let sink = AuditSink::with_opener(config, Some(opener(&flaky)), slot);
        sink.record(&serde_json::json!({"i": 1}));
        sink.shared.write_pending();
        *flaky.fail_syncs.lock() = 2;
        sink.shared.sync();
        assert!(!sink.health().writable, "the first sync failed");
        sink.record(&serde_json::json!({"i": 2}));
        sink.shared.write_pending();
        assert!(!sink.health().writable, "a write does not heal it");
        // Tried at most once a second (a failing disk is not asked at every batch).
        // Past `SYNC_EVERY` (a second).
        let a_second = || std::thread::sleep(std::time::Duration::from_millis(1050));
        a_second();
        sink.shared.sync_due();
        assert!(!sink.health().writable, "the second sync failed");
        sink.shared.sync_due();
        assert_eq!(*flaky.fail_syncs.lock(), 0, "tried once this second");
        assert!(!sink.health().writable, "not tried again within the second");
        // Nothing written since: the next one heals it.
        a_second();
        sink.shared.sync_due();
        assert!(sink.health().writable, "{:?}", sink.health());
        assert_eq!(sink.health().unwritten, 2, "both records counted lost");
        // Failing again, the file moved and none can be opened at the path: not healed
        // by a sync of nothing; the file at the path, once it opens, is.
        *flaky.fail_syncs.lock() = 1;
        sink.shared.sync();
        *flaky.moved.lock() = true;
        *flaky.fail_opens.lock() = 1;
        a_second();
        sink.shared.sync_due();
        let health = sink.health();
        crate::audit::assert_failing(&health, "cannot be opened");
        a_second();
        sink.shared.sync_due();
        assert!(sink.health().writable, "{:?}", sink.health());
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

    // The file cut to nothing by another hand (logrotate's copytruncate) while a batch
    // failed: it is not cut back to where the batch began, past its end, which would
    // pad it with zeros.
    #[test]
    fn a_failed_batch_in_a_file_cut_meanwhile_pads_nothing() {
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n{\"b\":2}\n").expect("first batch");
        *flaky.fail_after.lock() = Some(3);
        *flaky.shrink_first.lock() = true;
        assert!(file.write(b"{\"c\":3}\n").is_err());
        assert!(!flaky.data.lock().contains(&0), "{:?}", flaky.data.lock());
        file.write(b"{\"c\":3}\n").expect("retried");
        let data = flaky.data.lock().clone();
        assert!(!data.contains(&0), "{data:?}");
        assert!(
            data.ends_with(b"{\"c\":3}\n"),
            "{:?}",
            String::from_utf8_lossy(&data)
        );
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
    #[test]
    fn a_torn_write_not_cut_back_is_cut_at_reopen_only_if_no_other_process_wrote_since() {
        for other_wrote in [false, true] {
            let flaky = Flaky::default();
            let mut file = AuditFile::new(opener(&flaky));
            file.write(b"{\"a\":1}\n").expect("first batch");
            *flaky.fail_after.lock() = Some(3);
            *flaky.fail_truncate.lock() = true;
            assert!(file.write(b"{\"b\":2}\n").is_err());
            if other_wrote {
                // Another harness: its record starts on a line of its own.
                let mut other = AuditFile::new(opener(&flaky));
                other.write(b"{\"x\":0}\n").expect("the other's batch");
            }
            file.write(b"{\"b\":2}\n").expect("retried");
            let want: &[u8] = if other_wrote {
                b"{\"a\":1}\n{\"b\n{\"x\":0}\n{\"b\":2}\n"
            } else {
                b"{\"a\":1}\n{\"b\":2}\n"
            };
            assert_eq!(&*flaky.data.lock(), want, "other wrote: {other_wrote}");
        }
    }

    // A batch torn after some of its records, in a file that cannot be cut (append-only,
    // a pipe): the records written whole stay and are not written again; the rest are,
    // after the torn one, on a line of their own.
    #[test]
    fn the_whole_records_of_a_torn_batch_that_cannot_be_cut_are_kept_not_written_twice() {
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n").expect("first batch");
        let batch = b"{\"b\":2}\n{\"c\":3}\n{\"d\":4}\n";
        *flaky.fail_after.lock() = Some(18);
        *flaky.fail_truncate.lock() = true;
        let failed = file.write(batch).expect_err("torn");
        assert_eq!(failed.kept, 16, "two records whole");
        *flaky.fail_truncate.lock() = true;
        file.write(&batch[failed.kept..]).expect("the rest");
        assert_eq!(
            &*flaky.data.lock(),
            b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n{\"\n{\"d\":4}\n",
            "each record once; the torn one ended"
        );
        // When the cut works at the reopen, it takes the torn record only.
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n").expect("first batch");
        *flaky.fail_after.lock() = Some(18);
        *flaky.fail_truncate.lock() = true;
        let failed = file.write(batch).expect_err("torn");
        file.write(&batch[failed.kept..]).expect("the rest");
        assert_eq!(
            &*flaky.data.lock(),
            b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n{\"d\":4}\n"
        );
    }

    #[test]
    fn a_torn_record_that_cannot_be_cut_is_ended_before_the_next_batch() {
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n").expect("first batch");
        // Torn, and the cut fails now and at the next open (an append-only file): the
        // trail goes on, the torn record on a line of its own.
        *flaky.fail_after.lock() = Some(3);
        *flaky.fail_truncate.lock() = true;
        assert!(file.write(b"{\"b\":2}\n").is_err());
        *flaky.fail_truncate.lock() = true;
        file.write(b"{\"b\":2}\n")
            .expect("written past the torn record");
        assert_eq!(&*flaky.data.lock(), b"{\"a\":1}\n{\"b\n{\"b\":2}\n");
        // Another process's torn record is ended the same way.
        flaky.data.lock().extend_from_slice(b"{\"t");
        file.write(b"{\"c\":3}\n").expect("written");
        assert_eq!(
            &*flaky.data.lock(),
            b"{\"a\":1}\n{\"b\n{\"b\":2}\n{\"t\n{\"c\":3}\n"
        );
    }

    #[test]
    fn a_torn_record_in_a_real_file_is_ended_before_the_next_batch() {
        let dir = crate::util::scratch::Scratch::new("torn-real");
        let path = dir.join("audit.jsonl");
        let mut file = AuditFile::new(file_opener(path.clone()));
        file.write(b"{\"a\":1}\n").expect("first batch");
        // Another process's record, torn and left uncut.
        {
            use std::io::Write;
            let mut other = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .expect("open");
            other.write_all(b"{\"t").expect("torn");
        }
        file.write(b"{\"b\":2}\n").expect("second batch");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            b"{\"a\":1}\n{\"t\n{\"b\":2}\n"
        );
    }

    #[test]
    fn a_file_cut_by_someone_else_is_not_padded_back_after_a_failed_write() {
        let flaky = Flaky::default();
        let mut file = AuditFile::new(opener(&flaky));
        file.write(b"{\"a\":1}\n{\"b\":2}\n").expect("first batch");
        // `copytruncate`: the file is emptied under the writer.
        flaky.data.lock().clear();
        *flaky.fail_after.lock() = Some(3);
        assert!(file.write(b"{\"c\":3}\n").is_err());
        assert!(
            flaky.data.lock().is_empty(),
            "cut back to where it started, not padded"
        );
        file.write(b"{\"c\":3}\n").expect("retried");
        assert_eq!(&*flaky.data.lock(), b"{\"c\":3}\n");
    }

    #[test]
    fn the_key_file_is_used_only_when_this_user_made_it_for_this() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("audit-key");
        std::fs::create_dir_all(&*dir).expect("dir");
        let audit = dir.join("audit.jsonl");
        let key_path = dir.join("audit.jsonl.key");
        let made = load_or_create_key(Some(&audit));
        assert_eq!(made.len(), 32);
        let mode = std::fs::metadata(&key_path)
            .expect("kept")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_key(Some(&audit)), made, "read back");
        // Readable by others: not used, and not replaced.
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_ne!(load_or_create_key(Some(&audit)), made);
        assert_eq!(std::fs::read(&key_path).expect("still there"), made);
        // A link to a key someone else knows: not followed.
        std::fs::remove_file(&key_path).expect("rm");
        let planted = dir.join("planted");
        std::fs::write(&planted, [7u8; 32]).expect("plant");
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::symlink(&planted, &key_path).expect("link");
        assert_ne!(load_or_create_key(Some(&audit)), vec![7u8; 32]);
        // Too long to be a key (a link to a device, a log).
        std::fs::remove_file(&key_path).expect("rm");
        std::fs::write(&key_path, vec![1u8; 4096]).expect("write");
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(load_or_create_key(Some(&audit)).len(), 32);
        assert_eq!(std::fs::read(&key_path).expect("left").len(), 4096);
        let _ = std::fs::remove_dir_all(&*dir);
    }
    #[test]
    fn an_audit_file_others_may_write_or_own_or_a_link_another_made_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("audit-owner");
        std::fs::create_dir_all(&*dir).expect("dir");
        let path = dir.join("audit.jsonl");
        let open = |p: &Path| file_opener(p.to_path_buf())().map(|_| ());
        let denied = |r: std::io::Result<()>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied);
        open(&path).expect("created");
        for mode in [0o666, 0o620] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert!(denied(open(&path)), "{mode:o}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        open(&path).expect("this user's, readable by its group");
        // A link of this user's is followed.
        let link = dir.join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).expect("link");
        open(&link).expect("followed");
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Another user's link (made by root's chown here), and another user's file.
            let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
            // SAFETY: lchown and chown on paths made here, NUL-terminated.
            assert_eq!(unsafe { libc::lchown(c(&link).as_ptr(), 65534, 65534) }, 0);
            assert!(denied(open(&link)), "another user's link");
            assert_eq!(unsafe { libc::chown(c(&path).as_ptr(), 65534, 65534) }, 0);
            assert!(denied(open(&path)), "another user's file");
        }
        let _ = std::fs::remove_dir_all(&*dir);
    }

    #[test]
    fn processes_starting_together_share_one_key() {
        let dir = crate::util::scratch::Scratch::new("audit-key-race");
        std::fs::create_dir_all(&*dir).expect("dir");
        for round in 0..20 {
            let audit = dir.join(format!("audit-{round}.jsonl"));
            let keys: Vec<Vec<u8>> = std::thread::scope(|s| {
                let racers: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| load_or_create_key(Some(&audit))))
                    .collect();
                racers
                    .into_iter()
                    .map(|r| r.join().expect("thread"))
                    .collect()
            });
            let on_disk =
                std::fs::read(dir.join(format!("audit-{round}.jsonl.key"))).expect("kept");
            assert!(
                keys.iter().all(|k| *k == on_disk),
                "round {round}: every racer uses the kept key"
            );
        }
        let leftovers = std::fs::read_dir(&*dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        assert_eq!(leftovers, 0, "no temporary key files are left");
        let _ = std::fs::remove_dir_all(&*dir);
    }
}
