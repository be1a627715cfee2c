//! The sink calls put records into, shared with the audit actor that drains it.
//!
//! Recording never waits on the actor and wakes it only when a batch is full (its timer
//! takes the rest), so the trail costs the call path no task switch. The buffer and the
//! file live here, outside the actor: a rebuilt actor drains the same buffer, and the
//! last holder to drop the sink writes what is left.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::file::{AuditFile, Opener, file_opener, load_or_create_key};
use super::msg::AuditMsg;
use super::record::Record;
use super::{AuditConfig, AuditFailure};
use crate::util::hash::hmac_sha256_hex;
use crate::util::slot::ActorSlot;

/// How long [`AuditSink::open`] waits for the key file.
const KEY_WAIT: Duration = Duration::from_secs(5);

/// The key `load` reads on a blocking thread, or, past `wait`, a key for this process
/// only (`load` goes on alone, its answer dropped).
async fn key_within(load: impl FnOnce() -> Vec<u8> + Send + 'static, wait: Duration) -> Vec<u8> {
    match tokio::time::timeout(wait, tokio::task::spawn_blocking(load)).await {
        Ok(Ok(key)) => key,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "reading the audit trail's key file failed; a key for this process only (auth contexts hash apart from other runs')");
            crate::util::secret::random_key()
        }
        Err(_) => {
            tracing::error!(
                ?wait,
                "the audit trail's key file was not read in time; a key for this process only (auth contexts hash apart from other runs')"
            );
            crate::util::secret::random_key()
        }
    }
}

/// The keyed hash of an auth context (128 bits of HMAC-SHA256, hex).
fn keyed(key: &[u8], context: &str) -> String {
    let mut h = hmac_sha256_hex(key, context.as_bytes());
    h.truncate(32);
    h
}

/// Bytes held while the file cannot be written, in `keep_serving` mode; past it the
/// oldest records are counted as unwritten instead of growing memory.
const KEEP_SERVING_BOUND: usize = 64 * 1024 * 1024;

/// A write that has not returned for this long counts as failing (a pipe no one reads,
/// a stalled network mount): `fail_closed` refuses calls, `keep_serving` holds its bound.
pub(super) const STALLED_WRITE: Duration = Duration::from_secs(5);

/// Auth contexts whose hashes are remembered (a call's context is hashed once, not
/// once per record; a flood of distinct contexts only empties the memo).
const HASH_MEMO: usize = 4096;

/// The largest buffer a thread keeps between records.
const LINE_KEPT: usize = 64 * 1024;

thread_local! {
    /// The record being serialized on this thread; a record over `LINE_KEPT` bytes
    /// (arguments recorded in full) is not kept for the next.
    static LINE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(512));
}

/// Calls are refused: the audit file cannot be written (`on_failure = "fail_closed"`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail cannot be written ({reason}); calls are refused until it can")]
pub struct AuditUnavailable {
    /// The last write error.
    pub reason: String,
}

/// The audit trail's state, for status and metrics. Read, not built: it may gain
/// fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditHealth {
    /// Whether the trail is not failing: the last open, write and sync succeeded, and
    /// none has been under way for 5 s.
    pub writable: bool,
    /// Why it fails, while not writable.
    pub last_error: Option<String>,
    /// Records accepted and not yet written (a write stuck under way included).
    pub backlog: usize,
    /// Records lost: dropped under `keep_serving` past the buffer's bound, or written
    /// and then not synced to the disk (the sync failed).
    pub unwritten: u64,
    /// Calls begun whose `finished` record has not come: the calls in flight now, and
    /// from `shutdown()`, those still running past its bounded waits, whose trail it
    /// leaves without their final record.
    pub unfinished: usize,
}

/// Serialized records, one JSON line each.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    records: usize,
    /// The writer was woken for this batch: it is full and a drain is on its way. The
    /// records that arrive before the drain do not wake it again (each wake costs a
    /// blocking-pool hand-off; one per record past the batch size once cost a third of
    /// the call path's CPU).
    woken: bool,
}

impl Batch {
    fn append(&mut self, other: &mut Batch) {
        self.bytes.append(&mut other.bytes);
        self.records += std::mem::take(&mut other.records);
        other.woken = false;
    }

    /// Drops the first `bytes` (whole records, written already); how many records.
    fn take_front(&mut self, bytes: usize) -> usize {
        let bytes = bytes.min(self.bytes.len());
        let records = self.bytes[..bytes].iter().filter(|b| **b == b'\n').count();
        self.bytes.drain(..bytes);
        self.records -= records.min(self.records);
        records
    }

    /// Drops the oldest whole lines until at most `max` bytes are left; how many.
    fn trim_to(&mut self, max: usize) -> usize {
        if self.bytes.len() <= max {
            return 0;
        }
        // The first line to keep starts after the last newline before `cut` (a cut at
        // a line's start keeps that line).
        let cut = self.bytes.len() - max;
        let end = self.bytes[cut - 1..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(self.bytes.len(), |p| cut + p);
        let dropped = self.bytes[..end].iter().filter(|b| **b == b'\n').count();
        self.bytes.drain(..end);
        self.records -= dropped.min(self.records);
        dropped
    }
}

pub(super) struct Shared {
    pub(super) config: AuditConfig,
    key: Vec<u8>,
    memo: Mutex<HashMap<String, Arc<str>>>,
    pending: Mutex<Batch>,
    /// Drained from `pending`, waiting for a write that succeeds.
    retry: Mutex<Batch>,
    file: Mutex<Option<AuditFile>>,
    writable: AtomicBool,
    last_error: Mutex<Option<String>>,
    unwritten: AtomicU64,
    /// Records written since the last sync to the disk: lost, for all anyone can tell,
    /// if that sync fails.
    pub(super) unsynced: AtomicU64,
    /// When the last timed sync ran, in milliseconds after `epoch`.
    synced_at: AtomicU64,
    /// The last sync failed: the trail fails until a sync succeeds (a write that
    /// reaches only the page cache does not heal it), tried again at each timer.
    sync_failed: AtomicBool,
    /// Records in `retry`, readable while a write holds it (health never waits on I/O).
    retrying: std::sync::atomic::AtomicUsize,
    /// When the write under way began, in milliseconds after `epoch` (0: none).
    writing_since: AtomicU64,
    epoch: std::time::Instant,
    /// A write without the actor is under way (see [`AuditSink::record`]).
    orphan_write: AtomicBool,
    /// Set by the first actor's start: a rebuilt one does not hold its supervisor up.
    started: AtomicBool,
    /// A sync of written records is armed on the actor's clock (see `arm_sync`).
    sync_armed: AtomicBool,
    /// An orphan write waits to sync what it wrote (no actor arms a sync for it).
    orphan_sync_waits: AtomicBool,
}

/// How often what was written is synced to the disk while the harness runs. A write
/// reaches only the page cache; a disk that refuses it (a quota reached on a network
/// mount, EIO) says so only at the sync, and a host that crashes loses what was not
/// synced. Without a timed sync both waited for shutdown: the trail counted as
/// writable, and `fail_closed` admitted calls, all along.
pub(super) const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Shared {
    /// Writes everything accepted so far; blocking I/O (run it off the async threads).
    /// On failure the records stay, in order, for the next attempt.
    pub(super) fn write_pending(&self) {
        let mut file = self.file.lock();
        let mut retry = self.retry.lock();
        {
            // Moved and counted under `pending`'s lock, which `health` reads both
            // under: a batch is never counted in both places.
            let mut pending = self.pending.lock();
            retry.append(&mut pending);
            self.retrying.store(retry.records, Ordering::SeqCst);
        }
        if retry.records == 0 {
            // Nothing to write: a trail failing for a file that could not be opened
            // (calls refused, so no records come) tries to open it again. (One failing
            // for a failed write stays so until a write succeeds, for a failed sync
            // until a sync does: `sync_due`.)
            if !self.writable.load(Ordering::SeqCst) && file.as_ref().is_some_and(|f| !f.is_open())
            {
                self.open_now(&mut file);
            }
            return;
        }
        let Some(file) = file.as_mut() else {
            *retry = Batch::default();
            self.retrying.store(0, Ordering::SeqCst);
            return;
        };
        self.writing_since
            .store(self.since_epoch().max(1), Ordering::SeqCst);
        let written = file.write(&retry.bytes);
        self.writing_since.store(0, Ordering::SeqCst);
        match written {
            Ok(()) => {
                self.unsynced
                    .fetch_add(retry.records as u64, Ordering::SeqCst);
                *retry = Batch::default();
                self.retrying.store(0, Ordering::SeqCst);
                if !self.sync_failed.load(Ordering::SeqCst) {
                    self.writable_again();
                }
            }
            Err(failed) => {
                // Whole records the file kept (a torn batch it could not cut) are
                // written: not again.
                let kept = retry.take_front(failed.kept);
                self.unsynced.fetch_add(kept as u64, Ordering::SeqCst);
                let e = failed.error;
                if self.writable.swap(false, Ordering::SeqCst) {
                    tracing::error!(error = %e, records = retry.records, "audit write failed; records kept for the next attempt");
                }
                *self.last_error.lock() = Some(e.to_string());
                if self.config.on_failure == AuditFailure::KeepServing {
                    let dropped = retry.trim_to(KEEP_SERVING_BOUND);
                    self.unwritten.fetch_add(dropped as u64, Ordering::Relaxed);
                }
                self.retrying.store(retry.records, Ordering::SeqCst);
            }
        }
    }
}

impl Shared {
    /// Opens the file now, if it is not open: at start (so that `fail_closed` refuses
    /// calls from the first when it cannot be opened, not from the first batch), and
    /// while the trail fails with nothing to write. Blocking I/O.
    pub(super) fn probe(&self) {
        // A write under way (a rebuilt actor's probe) has the file open already, or is
        // stuck in it: not waited for.
        let Some(mut file) = self.file.try_lock() else {
            return;
        };
        // Open already (a rebuilt actor's probe): a trail failing for a failed write or
        // sync heals only by a write that succeeds.
        if file.as_ref().is_some_and(AuditFile::is_open) {
            return;
        }
        self.open_now(&mut file);
    }

    fn open_now(&self, file: &mut Option<AuditFile>) {
        let Some(file) = file.as_mut() else {
            return;
        };
        // Timed as a write: an open stuck in a mount counts as a stalled write.
        self.writing_since
            .store(self.since_epoch().max(1), Ordering::SeqCst);
        let opened = file.ensure_open();
        self.writing_since.store(0, Ordering::SeqCst);
        match opened {
            // Records still waiting for a write that failed: that write heals it.
            Ok(()) if self.retrying.load(Ordering::SeqCst) > 0 => {}
            Ok(()) => {
                if !self.writable.swap(true, Ordering::SeqCst) {
                    tracing::info!("audit trail writable again");
                }
                *self.last_error.lock() = None;
            }
            Err(e) => {
                if self.writable.swap(false, Ordering::SeqCst) {
                    tracing::error!(error = %e, "the audit file cannot be opened");
                }
                *self.last_error.lock() = Some(e.to_string());
            }
        }
    }

    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Why the file counts as not writable now: the last write failed, or the one
    /// under way has not returned for [`STALLED_WRITE`].
    fn failing(&self) -> Option<String> {
        if let Some(stalled) = self.stalled() {
            return Some(format!(
                "a write has not returned for {} s",
                stalled.as_secs()
            ));
        }
        if self.writable.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.last_error.lock().clone().unwrap_or_default())
    }

    /// How long the write under way has been, once that is [`STALLED_WRITE`] or more.
    fn stalled(&self) -> Option<std::time::Duration> {
        let since = self.writing_since.load(Ordering::SeqCst);
        // No write under way (nearly always): no clock read, which every call's
        // admission would otherwise pay.
        if since == 0 {
            return None;
        }
        let stalled = self.since_epoch().saturating_sub(since);
        (stalled >= STALLED_WRITE.as_millis() as u64)
            .then(|| std::time::Duration::from_millis(stalled))
    }

    /// [`Shared::sync`], when records were written since the last one and that was
    /// [`SYNC_EVERY`] ago or more. Blocking I/O.
    pub(super) fn sync_due(&self) {
        // A sync that failed is tried again, written records or not: no record may
        // come to start one (`fail_closed` refuses calls meanwhile).
        let failed = self.sync_failed.load(Ordering::SeqCst);
        if !failed && self.unsynced.load(Ordering::SeqCst) == 0 {
            return;
        }
        let now = self.since_epoch();
        let every = SYNC_EVERY.as_millis() as u64;
        if now.saturating_sub(self.synced_at.load(Ordering::SeqCst)) < every {
            return;
        }
        self.synced_at.store(now, Ordering::SeqCst);
        if failed {
            // Moved meanwhile (the path put on a disk that works): the retry syncs the
            // file at the path, not the one that keeps failing. Timed as a write: an
            // open stuck in a mount is a stalled write.
            let reopened = match self.file.lock().as_mut() {
                Some(file) => {
                    self.writing_since
                        .store(self.since_epoch().max(1), Ordering::SeqCst);
                    let opened = file.ensure_open();
                    self.writing_since.store(0, Ordering::SeqCst);
                    opened
                }
                None => Ok(()),
            };
            if let Err(e) = reopened {
                // Nothing open to sync, which would pass for a sync that worked.
                *self.last_error.lock() = Some(format!("the audit file cannot be opened: {e}"));
                self.writable.store(false, Ordering::SeqCst);
                return;
            }
        }
        self.sync();
    }

    /// Flushes what the file holds to the disk (a failure is logged).
    pub(super) fn sync(&self) {
        if let Some(file) = self.file.lock().as_mut() {
            // Timed as a write: a sync stuck in the disk (a stalled mount) is a stalled
            // write to shutdown and to fail_closed, not a flush waited out for 30 s.
            self.writing_since
                .store(self.since_epoch().max(1), Ordering::SeqCst);
            let synced = file.sync();
            self.writing_since.store(0, Ordering::SeqCst);
            let unsynced = self.unsynced.swap(0, Ordering::SeqCst);
            if let Err(e) = synced {
                // The kernel may have dropped the pages it could not write (EIO): the
                // records since the last sync count as unwritten, and the trail as
                // failing until a sync succeeds, so that shutdown reports it.
                if !self.sync_failed.swap(true, Ordering::SeqCst) || unsynced > 0 {
                    tracing::error!(error = %e, records = unsynced, "audit file not synced to disk; the records written since the last sync may be lost");
                }
                self.unwritten.fetch_add(unsynced, Ordering::Relaxed);
                self.writable.store(false, Ordering::SeqCst);
                *self.last_error.lock() = Some(format!("sync to disk failed: {e}"));
            } else if self.sync_failed.swap(false, Ordering::SeqCst)
                && self.retrying.load(Ordering::SeqCst) == 0
            {
                self.writable_again();
            }
        }
    }

    /// The trail works again (a write, or a sync after one failed, succeeded).
    fn writable_again(&self) {
        if !self.writable.swap(true, Ordering::SeqCst) {
            tracing::info!("audit trail writable again");
        }
        *self.last_error.lock() = None;
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last holder: what was accepted is still written, and synced. Often on a
        // runtime's worker (a harness dropped without `shutdown()`, its actors killed),
        // whose other tasks move to another while the write blocks (a pipe read slowly,
        // a mount).
        crate::util::blocking(|| {
            self.write_pending();
            self.sync();
        });
        let left = self.retrying.load(Ordering::SeqCst);
        if left > 0 {
            tracing::error!(
                records = left,
                error = self.last_error.lock().as_deref().unwrap_or("-"),
                "audit records lost: the file could not be written before the harness ended"
            );
        }
    }
}

/// Where calls put their records; cheap to clone.
#[derive(Clone)]
pub struct AuditSink {
    pub(super) shared: Arc<Shared>,
    pub(super) actor: ActorSlot<AuditMsg>,
}

impl AuditSink {
    /// A sink for `config`, whose actor (woken when a batch is full) will sit in `actor`.
    #[cfg(test)]
    pub fn new(config: AuditConfig, actor: ActorSlot<AuditMsg>) -> AuditSink {
        let opener = config.path.clone().map(file_opener);
        Self::with_opener(config, opener, actor)
    }

    /// A sink for `config`, whose actor (woken when a batch is full) will sit in
    /// `actor`, with the key file read (or made) on a blocking thread for at most
    /// [`KEY_WAIT`]: a trail on a mount that hangs holds the start of the harness that
    /// long at most, which goes on with a key of this process's own (its calls then
    /// wait on the trail's writes as on any stalled trail).
    pub async fn open(config: AuditConfig, actor: ActorSlot<AuditMsg>) -> AuditSink {
        let path = config.path.clone();
        let load = move || load_or_create_key(path.as_deref());
        let key = key_within(load, KEY_WAIT).await;
        let opener = config.path.clone().map(file_opener);
        Self::with_key(config, opener, actor, key)
    }

    #[cfg(test)]
    pub(super) fn with_opener(
        config: AuditConfig,
        opener: Option<Opener>,
        actor: ActorSlot<AuditMsg>,
    ) -> AuditSink {
        let key = load_or_create_key(config.path.as_deref());
        Self::with_key(config, opener, actor, key)
    }

    fn with_key(
        config: AuditConfig,
        opener: Option<Opener>,
        actor: ActorSlot<AuditMsg>,
        key: Vec<u8>,
    ) -> AuditSink {
        AuditSink {
            shared: Arc::new(Shared {
                config,
                key,
                memo: Mutex::new(HashMap::new()),
                pending: Mutex::new(Batch::default()),
                retry: Mutex::new(Batch::default()),
                file: Mutex::new(opener.map(AuditFile::new)),
                writable: AtomicBool::new(true),
                last_error: Mutex::new(None),
                unwritten: AtomicU64::new(0),
                unsynced: AtomicU64::new(0),
                sync_armed: AtomicBool::new(false),
                orphan_sync_waits: AtomicBool::new(false),
                synced_at: AtomicU64::new(0),
                sync_failed: AtomicBool::new(false),
                retrying: std::sync::atomic::AtomicUsize::new(0),
                writing_since: AtomicU64::new(0),
                epoch: std::time::Instant::now(),
                orphan_write: AtomicBool::new(false),
                started: AtomicBool::new(false),
            }),
            actor,
        }
    }

    /// The settings (redaction) the records follow.
    pub fn config(&self) -> &AuditConfig {
        &self.shared.config
    }

    /// Whether a new call may start: refused while the file cannot be written, in
    /// `fail_closed` mode.
    pub fn admit(&self) -> Result<(), AuditUnavailable> {
        let s = &self.shared;
        if s.config.on_failure == AuditFailure::FailClosed
            && let Some(reason) = s.failing()
        {
            return Err(AuditUnavailable { reason });
        }
        Ok(())
    }

    /// An auth context as records carry it: HMAC-SHA256 under the trail's key.
    pub(crate) fn hash_context(&self, ctx: Option<&str>) -> Option<Arc<str>> {
        let ctx = ctx?;
        let mut memo = self.shared.memo.lock();
        if let Some(h) = memo.get(ctx) {
            return Some(h.clone());
        }
        let h: Arc<str> = keyed(&self.shared.key, ctx).into();
        if memo.len() >= HASH_MEMO {
            memo.clear();
        }
        memo.insert(ctx.to_string(), h.clone());
        Some(h)
    }

    /// Whether records go anywhere: a file, or a `tracing` subscriber that listens to
    /// target `mcp_harness::audit`. When not, the call path builds none.
    pub fn is_recording(&self) -> bool {
        self.shared.config.path.is_some()
            || tracing::enabled!(target: "mcp_harness::audit", tracing::Level::INFO)
    }

    /// Appends one record, serialized into the buffer the writer drains.
    pub(crate) fn record(&self, record: &impl Record) {
        // Serialized before the lock, so that calls on other threads wait only for a
        // copy, into this thread's own buffer (no allocation per record).
        let append = |line: &mut Vec<u8>| {
            line.clear();
            record.write_json(line);
            // A caller's or a server's text (a tool name, arguments recorded in full)
            // must not split the line for a reader, nor act on a terminal.
            crate::util::text::json_inert(line);
            if tracing::enabled!(target: "mcp_harness::audit", tracing::Level::INFO) {
                // JSON that serde_json wrote is UTF-8: this borrows, never copies.
                let text = String::from_utf8_lossy(line);
                tracing::info!(target: "mcp_harness::audit", record = %text, "audit");
            }
            if self.shared.config.path.is_none() {
                return false;
            }
            line.push(b'\n');
            let mut pending = self.shared.pending.lock();
            pending.bytes.extend_from_slice(line);
            pending.records += 1;
            // The writer is stuck in a write (a failing one trims `retry` itself): in
            // `keep_serving`, what waits behind it is held to the same bound, cut to
            // three quarters of it so that the cut is not made again at each record.
            if self.shared.config.on_failure == AuditFailure::KeepServing
                && pending.bytes.len() > KEEP_SERVING_BOUND
                && self.shared.failing().is_some()
            {
                let dropped = pending.trim_to(KEEP_SERVING_BOUND / 4 * 3);
                self.shared
                    .unwritten
                    .fetch_add(dropped as u64, Ordering::Relaxed);
            }
            let batch = self.shared.config.batch.max(1);
            // A wake-up that never led to a drain (the actor killed with it in its
            // mailbox, and gone for good: its timer gone too) is given again once the
            // backlog is a batch more, at each batch, if no actor runs now.
            let lost = pending.woken
                && pending.records >= 2 * batch
                && pending.records.is_multiple_of(batch)
                && !self.writer_runs();
            let wake = (!pending.woken && pending.records >= batch) || lost;
            pending.woken |= wake;
            wake
        };
        // A thread's buffer is gone while it exits, and in use if a subscriber's
        // handling of the `info!` above records again: then a buffer of its own.
        let wake = LINE
            .try_with(|cell| match cell.try_borrow_mut() {
                Ok(mut line) => {
                    let wake = append(&mut line);
                    if line.capacity() > LINE_KEPT {
                        *line = Vec::with_capacity(512);
                    }
                    wake
                }
                Err(_) => append(&mut Vec::new()),
            })
            .unwrap_or_else(|_| append(&mut Vec::new()));
        // No actor took the wake-up: it is being rebuilt (the next record tries again),
        // or gone for good (the harness's root was stopped from outside, by an
        // embedder's supervisor): the batch is written here, on a blocking thread, one
        // write at a time, so that records neither pile up nor wait for a shutdown that
        // cannot reach the actor.
        if wake && !self.actor.send(AuditMsg::Tick) {
            self.shared.pending.lock().woken = false;
            if let Ok(runtime) = tokio::runtime::Handle::try_current()
                && !self.shared.orphan_write.swap(true, Ordering::SeqCst)
            {
                /// Lets the next orphan write go, however this one ends while it holds
                /// the claim (a task that a runtime shutting down never runs is dropped,
                /// and drops this; a write that panics unwinds through it).
                struct Claim(Arc<Shared>, bool);
                impl Drop for Claim {
                    fn drop(&mut self) {
                        if self.1 {
                            self.0.orphan_write.store(false, Ordering::SeqCst);
                        }
                    }
                }
                let mut claim = Claim(self.shared.clone(), true);
                runtime.spawn_blocking(move || {
                    loop {
                        claim.0.write_pending();
                        // Synced as the actor's drains are (at most once a second):
                        // nothing else would until the harness ends.
                        claim.0.sync_due();
                        claim.0.orphan_write.store(false, Ordering::SeqCst);
                        claim.1 = false;
                        // Records that came during the write found it under way: a
                        // batch of them is written now, as no record after may come.
                        let full = claim.0.pending.lock().records >= claim.0.config.batch.max(1);
                        if !full || claim.0.orphan_write.swap(true, Ordering::SeqCst) {
                            break;
                        }
                        claim.1 = true;
                    }
                    // Written less than a second after the last sync: synced once that
                    // second is up, as no actor arms a sync now; one such wait at a time,
                    // which goes on while records wait (another write may have come, or
                    // a sync meanwhile have made this one not due yet).
                    let shared = &claim.0;
                    while shared.unsynced.load(Ordering::SeqCst) > 0
                        && !shared.orphan_sync_waits.swap(true, Ordering::SeqCst)
                    {
                        std::thread::sleep(SYNC_EVERY);
                        shared.sync_due();
                        shared.orphan_sync_waits.store(false, Ordering::SeqCst);
                    }
                });
            }
        }
    }

    /// Whether this is the first actor's start (the harness's), not a rebuild.
    pub(super) fn first_start(&self) -> bool {
        !self.shared.started.swap(true, Ordering::SeqCst)
    }

    /// Whether records were written since the last sync.
    pub(super) fn unsynced(&self) -> bool {
        self.shared.unsynced.load(Ordering::SeqCst) > 0
    }

    /// Takes the one armed sync; false when one is armed already.
    pub(super) fn arm_sync(&self) -> bool {
        !self.shared.sync_armed.swap(true, Ordering::SeqCst)
    }

    /// The armed sync came (or died with the actor that armed it).
    pub(super) fn sync_fired(&self) {
        self.shared.sync_armed.store(false, Ordering::SeqCst);
    }

    /// Whether a full batch woke a writer that has not drained it yet: a writer that
    /// starts (rebuilt) drains it, as the wake-up may have died with the one before.
    pub(super) fn woken(&self) -> bool {
        self.shared.pending.lock().woken
    }

    /// Whether the writer's actor runs (is not being rebuilt, nor gone).
    fn writer_runs(&self) -> bool {
        (self.actor.get()).is_some_and(|a| ractor::ACTIVE_STATES.contains(&a.get_status()))
    }

    /// Whether a write is under way now (perhaps stuck in it).
    pub(crate) fn writing(&self) -> bool {
        self.shared.writing_since.load(Ordering::SeqCst) != 0
    }

    /// Returns once a write has been under way for [`STALLED_WRITE`]: one already
    /// under way, or one begun later (a flush's own write into a pipe that fills).
    pub(crate) async fn stalled(&self) {
        while self.shared.stalled().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Writes what is buffered and syncs the file, on a blocking thread: the audit
    /// actor's flush, done without it (it died while the harness shut down, when it is
    /// not rebuilt).
    pub(crate) async fn write_now(&self) {
        let shared = self.shared.clone();
        let written = tokio::task::spawn_blocking(move || {
            shared.write_pending();
            shared.sync();
        });
        if written.await.is_err() {
            tracing::error!("the audit writer task failed");
        }
    }

    /// The trail's state now.
    pub fn health(&self) -> AuditHealth {
        let s = &self.shared;
        // Never `retry`'s lock: the writer holds it during I/O, and takes it before
        // `pending` (holding `pending` while taking it here deadlocked).
        let (pending, retried) = {
            let pending = s.pending.lock();
            (pending.records, s.retrying.load(Ordering::SeqCst))
        };
        let failing = s.failing();
        AuditHealth {
            writable: failing.is_none(),
            last_error: failing,
            backlog: pending + retried,
            unwritten: s.unwritten.load(Ordering::Relaxed),
            unfinished: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A key file on a mount that hangs does not hold the harness's start: past the
    // wait, a key of this process's own.
    #[tokio::test]
    async fn a_key_file_that_hangs_is_waited_for_a_while_only() {
        // Held until the test ends, as a read stuck in a mount is.
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let hung = move || {
            let _ = stuck.recv();
            vec![7u8; 32]
        };
        let started = std::time::Instant::now();
        let key = key_within(hung, Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "not waited out");
        drop(release);
        assert_eq!(key.len(), 32);
        assert_ne!(key, vec![7u8; 32]);
        let read = key_within(|| vec![9u8; 32], Duration::from_secs(5)).await;
        assert_eq!(read, vec![9u8; 32], "read in time, used");
    }

    #[test]
    fn trimming_drops_only_the_oldest_whole_lines_it_must() {
        let batch = || Batch {
            bytes: b"AAAA\nBBBB\n".to_vec(),
            records: 2,
            woken: false,
        };
        for (max, kept, dropped) in [
            (10, "AAAA\nBBBB\n", 0),
            (5, "BBBB\n", 1),
            (4, "", 2),
            (7, "BBBB\n", 1),
        ] {
            let mut b = batch();
            assert_eq!(b.trim_to(max), dropped, "{max}");
            assert_eq!(b.bytes, kept.as_bytes(), "{max}");
            assert_eq!(b.records, 2 - dropped);
        }
    }

    #[test]
    fn auth_contexts_are_keyed_hashes_stable_across_restarts_and_not_plain_digests() {
        let dir = crate::util::scratch::Scratch::new("key");
        let config = AuditConfig {
            path: Some(dir.join("audit.jsonl")),
            ..AuditConfig::default()
        };
        let one = AuditSink::with_opener(config.clone(), None, ActorSlot::default());
        let two = AuditSink::with_opener(config, None, ActorSlot::default());
        let h = one.hash_context(Some("user-42")).expect("hash");
        assert_eq!(
            Some(h.clone()),
            two.hash_context(Some("user-42")),
            "the key is kept beside the file"
        );
        let plain = crate::util::hash::sha256_hex(b"user-42");
        assert!(
            !plain.starts_with(&h[..16]),
            "not a prefix of a plain SHA-256"
        );
        let other = AuditSink::with_opener(AuditConfig::default(), None, ActorSlot::default());
        assert_ne!(
            other.hash_context(Some("user-42")),
            Some(h),
            "another key, another hash"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("audit.jsonl.key"))
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// Counts the writer's wake-ups.
    struct Wakes;

    impl ractor::Actor for Wakes {
        type Msg = AuditMsg;
        type State = Arc<AtomicU64>;
        type Arguments = Arc<AtomicU64>;

        async fn pre_start(
            &self,
            _: ractor::ActorRef<AuditMsg>,
            count: Arc<AtomicU64>,
        ) -> Result<Arc<AtomicU64>, ractor::ActorProcessingErr> {
            Ok(count)
        }

        async fn handle(
            &self,
            _: ractor::ActorRef<AuditMsg>,
            _: AuditMsg,
            count: &mut Arc<AtomicU64>,
        ) -> Result<(), ractor::ActorProcessingErr> {
            count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// A sink writing to a file in `dir`, in batches of 4, whose writer only counts its
    /// wake-ups (in `count`).
    struct Woken {
        sink: AuditSink,
        path: std::path::PathBuf,
        actor: ractor::ActorRef<AuditMsg>,
        handle: tokio::task::JoinHandle<()>,
        count: Arc<AtomicU64>,
    }

    async fn woken(dir: &std::path::Path) -> Woken {
        let path = dir.join("audit.jsonl");
        let config = AuditConfig {
            path: Some(path.clone()),
            batch: 4,
            ..AuditConfig::default()
        };
        let count = Arc::new(AtomicU64::new(0));
        let (actor, handle) = ractor::Actor::spawn(None, Wakes, count.clone())
            .await
            .expect("spawn");
        let slot = ActorSlot::default();
        slot.set(actor.clone());
        Woken {
            sink: AuditSink::new(config, slot),
            path,
            actor,
            handle,
            count,
        }
    }

    #[tokio::test]
    async fn a_full_batch_wakes_the_writer_once_until_it_is_drained() {
        let dir = crate::util::scratch::Scratch::new("wakes");
        let Woken {
            sink,
            actor,
            handle,
            count,
            ..
        } = woken(&dir).await;
        // Waits until at least `at_least` wake-ups arrived (or 10 s passed), then a
        // moment more, so that a spare one would be seen too.
        let settle = |at_least: u64| {
            let count = count.clone();
            async move {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while count.load(Ordering::SeqCst) < at_least
                    && std::time::Instant::now() < deadline
                {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                count.load(Ordering::SeqCst)
            }
        };
        for i in 0..40u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        assert_eq!(
            settle(1).await,
            1,
            "one wake for a batch, not one per record past it"
        );
        sink.shared.write_pending();
        for i in 0..3u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        assert_eq!(settle(1).await, 1, "a batch not yet full wakes nobody");
        sink.record(&serde_json::json!({"i": 3}));
        assert_eq!(
            settle(2).await,
            2,
            "the next full batch wakes the writer again"
        );
        actor.stop(None);
        let _ = handle.await;
    }

    // A wake-up lost with its actor (killed with it in its mailbox) and a rebuilt actor:
    // the rebuilt one drains the batch as it starts. Before, the batch waited for its
    // timer (`flush_every`, up to an hour), and the records after it too, as no record
    // woke a writer again while one ran.
    #[tokio::test]
    async fn a_wake_up_lost_with_a_killed_writer_is_taken_by_the_one_rebuilt() {
        let dir = crate::util::scratch::Scratch::new("rebuilt-wake");
        let path = dir.join("audit.jsonl");
        let config = AuditConfig {
            path: Some(path.clone()),
            batch: 4,
            flush_every: std::time::Duration::from_secs(3600),
            ..AuditConfig::default()
        };
        let count = Arc::new(AtomicU64::new(0));
        let (lost, handle) = ractor::Actor::spawn(None, Wakes, count.clone())
            .await
            .expect("spawn");
        let slot = ActorSlot::default();
        slot.set(lost.clone());
        let sink = AuditSink::new(config, slot.clone());
        for i in 0..4u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        lost.kill();
        let _ = handle.await;
        let (rebuilt, handle) = ractor::Actor::spawn(None, super::super::AuditActor, sink.clone())
            .await
            .expect("spawn");
        slot.set(rebuilt.clone());
        let lines = || {
            std::fs::read_to_string(&path)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while lines() < 4 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(lines(), 4, "the batch is written by the rebuilt writer");
        rebuilt.stop(None);
        let _ = handle.await;
    }

    // A wake-up lost with its actor (killed with it in its mailbox, and not rebuilt)
    // does not leave the records to pile up: once a batch more has come, they are
    // written by the orphan writer. Before, nothing woke anyone again.
    #[tokio::test]
    async fn a_wake_up_lost_with_the_writer_is_given_again() {
        let dir = crate::util::scratch::Scratch::new("lost-wake");
        let Woken {
            sink,
            path,
            actor,
            handle,
            count,
        } = woken(&dir).await;
        for i in 0..4u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        // Woken, and the wake-up taken by an actor that never drains, then killed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        actor.kill();
        let _ = handle.await;
        for i in 4..8u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        let lines = || {
            std::fs::read_to_string(&path)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while lines() < 8 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(lines(), 8, "every record written");
        // And synced as the actor's drains are, within a second or so: nothing else
        // would sync them while the harness runs.
        for i in 8..12u32 {
            sink.record(&serde_json::json!({"i": i}));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let synced = || lines() == 12 && sink.shared.unsynced.load(Ordering::SeqCst) == 0;
        while !synced() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(synced(), "written and synced");
    }

    #[test]
    fn health_read_while_records_are_written_never_deadlocks() {
        let dir = crate::util::scratch::Scratch::new("health");
        let config = AuditConfig {
            path: Some(dir.join("audit.jsonl")),
            ..AuditConfig::default()
        };
        let sink = AuditSink::with_opener(config, None, ActorSlot::default());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let writer = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for i in 0..20_000u32 {
                    sink.record(&serde_json::json!({"i": i}));
                    sink.shared.write_pending();
                }
            })
        };
        let reader = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    let _ = sink.health();
                }
                let _ = done_tx.send(());
            })
        };
        // A lock-order inversion between the two would hang here, not fail.
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_ok(),
            "health() and the writer deadlocked"
        );
        writer.join().expect("writer");
        reader.join().expect("reader");
        assert_eq!(sink.health().backlog, 0);
    }

    /// An output whose writes wait until the test lets them go.
    struct Held(std::sync::mpsc::Receiver<()>);

    impl super::super::file::Output for Held {
        fn append(&mut self, _: &[u8]) -> Result<(), (usize, std::io::Error)> {
            // Bounded, so that a failing test ends.
            let _ = self.0.recv_timeout(std::time::Duration::from_secs(30));
            Ok(())
        }
        fn truncate(&mut self, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&mut self) -> std::io::Result<u64> {
            Ok(0)
        }
    }

    #[test]
    fn a_write_that_never_returns_fails_the_trail_and_bounds_what_waits() {
        let (release, held) = std::sync::mpsc::channel();
        let mut held = Some(held);
        let opener: Opener = Box::new(move || match held.take() {
            Some(rx) => Ok(Box::new(Held(rx)) as Box<dyn super::super::file::Output>),
            None => Err(std::io::Error::other("opened once")),
        });
        let dir = crate::util::scratch::Scratch::new("stuck");
        let config = AuditConfig {
            path: Some(dir.join("audit.jsonl")),
            on_failure: AuditFailure::KeepServing,
            ..AuditConfig::default()
        };
        let sink = AuditSink::with_opener(config, Some(opener), ActorSlot::default());
        sink.record(&serde_json::json!({"first": true}));
        let writer = {
            let shared = sink.shared.clone();
            std::thread::spawn(move || shared.write_pending())
        };
        let began = std::time::Instant::now();
        while !sink.writing() {
            assert!(began.elapsed().as_secs() < 30, "the write never began");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(STALLED_WRITE + std::time::Duration::from_millis(100));
        let health = sink.health();
        crate::audit::assert_failing(&health, "not returned");
        // 80 MiB of records behind the stuck write: held to the bound, the oldest
        // counted as unwritten.
        let big = "x".repeat(1 << 20);
        for i in 0..80 {
            sink.record(&serde_json::json!({"i": i, "big": big}));
        }
        assert!(sink.shared.pending.lock().bytes.len() <= KEEP_SERVING_BOUND);
        assert!(sink.health().unwritten > 0);
        let _ = release.send(());
        writer.join().expect("writer");
        assert!(sink.health().writable);
        // The rest is written when the sink goes, at once.
        drop(release);
    }

    /// An output that cannot be cut (append-only, a pipe), whose first append fails
    /// after `fail_after` bytes.
    #[derive(Clone, Default)]
    struct Uncuttable {
        data: Arc<Mutex<Vec<u8>>>,
        fail_after: Arc<Mutex<Option<usize>>>,
        pipe: bool,
    }

    impl super::super::file::Output for Uncuttable {
        fn append(&mut self, bytes: &[u8]) -> Result<(), (usize, std::io::Error)> {
            let mut data = self.data.lock();
            match self.fail_after.lock().take() {
                Some(n) => {
                    let n = n.min(bytes.len());
                    data.extend_from_slice(&bytes[..n]);
                    Err((n, std::io::Error::from_raw_os_error(libc::ENOSPC)))
                }
                None => {
                    data.extend_from_slice(bytes);
                    Ok(())
                }
            }
        }
        fn truncate(&mut self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        }
        fn len(&mut self) -> std::io::Result<u64> {
            Ok(self.data.lock().len() as u64)
        }
        fn byte_at(&mut self, offset: u64) -> Option<u8> {
            self.data.lock().get(offset as usize).copied()
        }
        fn is_file(&mut self) -> bool {
            !self.pipe
        }
    }

    // A batch torn after some of its records in a file that cannot be cut: those stay,
    // counted written, and only the rest are written again (all of it was, and the
    // records before the tear were in the file twice). On a pipe, whose reader may
    // have gone without reading them, all are written again.
    #[test]
    fn the_records_a_torn_batch_left_whole_in_a_file_are_not_written_again() {
        for pipe in [false, true] {
            let output = Uncuttable {
                pipe,
                ..Uncuttable::default()
            };
            let opened = output.clone();
            let (_dir, sink) = three_records_for("uncuttable", move || opened.clone());
            let first_two = output_lines_len(&sink, 2);
            *output.fail_after.lock() = Some(first_two + 3);
            sink.shared.write_pending();
            assert!(!sink.health().writable);
            let waiting = if pipe { 3 } else { 1 };
            assert_eq!(sink.health().backlog, waiting, "{:?}", sink.health());
            sink.shared.write_pending();
            assert!(sink.health().writable, "{:?}", sink.health());
            let data = String::from_utf8(output.data.lock().clone()).expect("utf-8");
            let records: Vec<serde_json::Value> = data
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let ids: Vec<u64> = records.iter().filter_map(|r| r["i"].as_u64()).collect();
            let want: &[u64] = if pipe { &[0, 1, 0, 1, 2] } else { &[0, 1, 2] };
            assert_eq!(ids, want, "pipe: {pipe}: {data}");
        }
    }

    /// A sink whose file opens as what `output` makes, holding three records waiting.
    fn three_records_for<O: super::super::file::Output + 'static>(
        tag: &str,
        output: impl Fn() -> O + Send + 'static,
    ) -> (crate::util::scratch::Scratch, AuditSink) {
        let opener: Opener =
            Box::new(move || Ok(Box::new(output()) as Box<dyn super::super::file::Output>));
        let dir = crate::util::scratch::Scratch::new(tag);
        let config = AuditConfig {
            path: Some(dir.join("audit.jsonl")),
            ..AuditConfig::default()
        };
        let sink = AuditSink::with_opener(config, Some(opener), ActorSlot::default());
        for i in 0..3 {
            sink.record(&serde_json::json!({"i": i}));
        }
        (dir, sink)
    }

    /// How many bytes the first `n` records waiting in `sink` take.
    fn output_lines_len(sink: &AuditSink, n: usize) -> usize {
        let pending = sink.shared.pending.lock();
        let mut seen = 0;
        for (i, b) in pending.bytes.iter().enumerate() {
            if *b == b'\n' {
                seen += 1;
                if seen == n {
                    return i + 1;
                }
            }
        }
        pending.bytes.len()
    }

    /// An output whose writes go nowhere and whose sync fails (a disk returning EIO).
    struct SyncFails;

    impl super::super::file::Output for SyncFails {
        fn append(&mut self, _: &[u8]) -> Result<(), (usize, std::io::Error)> {
            Ok(())
        }
        fn truncate(&mut self, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&mut self) -> std::io::Result<u64> {
            Ok(0)
        }
        fn sync(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }
    }

    #[test]
    fn a_sync_that_fails_counts_the_records_since_the_last_as_unwritten() {
        let (_dir, sink) = three_records_for("sync-fails", || SyncFails);
        sink.shared.write_pending();
        assert!(sink.health().writable, "written, not yet synced");
        sink.shared.sync();
        let health = sink.health();
        crate::audit::assert_failing(&health, "sync");
        assert_eq!(health.unwritten, 3, "{health:?}");
        // Refused while it fails, in fail_closed mode (the default); neither a rebuilt
        // actor's probe, an idle tick (the file is open), nor a write (to the page
        // cache) heals it: only a sync that succeeds.
        assert!(sink.admit().is_err());
        sink.shared.probe();
        sink.shared.write_pending();
        assert!(!sink.health().writable, "{:?}", sink.health());
        // A later sync counts only what was written since.
        sink.record(&serde_json::json!({"i": 3}));
        sink.shared.write_pending();
        assert!(!sink.health().writable, "a write does not heal it");
        sink.shared.sync();
        assert_eq!(sink.health().unwritten, 4);
    }
}
