//! A legacy (2025-06-18 / 2025-11-25) HTTP session: the `Mcp-Session-Id` the server
//! issued, the version it chose, and what renewing it takes. A 404 on a request that
//! carried the id means the server forgot the session: the transport initializes again
//! (once for all the requests that saw it expire) and retries. The old id is kept until
//! a new one comes: a renewal that fails leaves a session that expires again, and is
//! renewed again, not a connection without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

#[derive(Default)]
struct State {
    id: Option<String>,
    version: Option<String>,
    /// The `initialize` params the session began with, to begin it again.
    init: Option<Value>,
    /// See [`Session::set_pending`].
    pending: Option<String>,
}

/// A session being begun, for answers while its `initialize` reply streams; no longer
/// when this drops (the reply read, failed, or cut off by its deadline).
pub(super) struct PendingSession<'a> {
    session: &'a Session,
    id: String,
}

impl<'a> PendingSession<'a> {
    pub(super) fn set(session: &'a Session, id: &str) -> PendingSession<'a> {
        session.set_pending(Some(id.to_string()));
        PendingSession {
            session,
            id: id.to_string(),
        }
    }
}

impl Drop for PendingSession<'_> {
    fn drop(&mut self) {
        let mut s = self.session.state.lock();
        if s.pending.as_deref() == Some(self.id.as_str()) {
            s.pending = None;
        }
    }
}

/// Where a session's renewals stood when a request went out.
#[derive(Clone, Copy)]
pub(super) struct Seen {
    renewals: u64,
    attempts: u64,
}

/// One connection's legacy session, if it has one.
#[derive(Default)]
pub(super) struct Session {
    state: Mutex<State>,
    /// Renewals, one at a time.
    renewing: Arc<tokio::sync::Mutex<()>>,
    /// Bumped by every renewal.
    renewals: AtomicU64,
    /// Bumped by every renewal begun, whatever its outcome.
    attempts: AtomicU64,
    /// Renewals failed since the last one that succeeded.
    failed_in_a_row: AtomicU64,
}

impl Session {
    pub(super) fn id(&self) -> Option<String> {
        self.state.lock().id.clone()
    }

    pub(super) fn has_id(&self) -> bool {
        self.state.lock().id.is_some()
    }

    pub(super) fn version(&self) -> Option<String> {
        self.state.lock().version.clone()
    }

    pub(super) fn set_id(&self, id: Option<String>) {
        self.state.lock().id = id;
    }

    pub(super) fn take_id(&self) -> Option<String> {
        self.state.lock().id.take()
    }

    /// Lets go of the session id if it is still `id`.
    pub(super) fn take_id_if(&self, id: &str) {
        let mut s = self.state.lock();
        if s.id.as_deref() == Some(id) {
            s.id = None;
        }
    }

    /// The version the server chose, sent from `initialized` on (the session is not
    /// one to renew until [`Session::begin`]).
    pub(super) fn set_version(&self, version: &str) {
        self.state.lock().version = Some(version.to_string());
    }

    /// A session an `initialize` reply began but not yet in use (a renewal's): the
    /// answers to what the server asks while that reply streams go to it.
    pub(super) fn set_pending(&self, id: Option<String>) {
        self.state.lock().pending = id;
    }

    /// The session answers to the server's requests go to: one being begun, else ours.
    pub(super) fn answering_id(&self) -> Option<String> {
        let s = self.state.lock();
        s.pending.clone().or_else(|| s.id.clone())
    }

    /// The session began: the version the server chose and the params to begin again.
    pub(super) fn begin(&self, version: &str, init: Value) {
        let mut s = self.state.lock();
        s.version = Some(version.to_string());
        s.init = Some(init);
    }

    /// The params to re-initialize with, if this is a legacy session.
    pub(super) fn init_params(&self) -> Option<Value> {
        self.state.lock().init.clone()
    }

    pub(super) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::SeqCst)
    }

    /// Where the session's renewals stood, as a request goes out.
    pub(super) fn seen(&self) -> Seen {
        Seen {
            renewals: self.renewals(),
            attempts: self.attempts.load(Ordering::SeqCst),
        }
    }

    /// Takes the renewal lock; `None` when another request renewed since `seen`. With
    /// it, whether this renewal is the first begun since `seen` (not one that waited
    /// for its turn behind another that failed).
    pub(super) async fn start_renewal(
        &self,
        seen: Seen,
    ) -> Option<(tokio::sync::OwnedMutexGuard<()>, bool)> {
        let guard = self.renewing.clone().lock_owned().await;
        if self.renewals() != seen.renewals {
            return None;
        }
        let first = self.attempts.fetch_add(1, Ordering::SeqCst) == seen.attempts;
        Some((guard, first))
    }

    pub(super) fn renewed(&self) {
        self.failed_in_a_row.store(0, Ordering::SeqCst);
        self.renewals.fetch_add(1, Ordering::SeqCst);
    }

    /// Notes an answer in the session: failed renewals before it are not in a row with
    /// any after it.
    pub(super) fn served(&self) {
        if self.failed_in_a_row.load(Ordering::Relaxed) != 0 {
            self.failed_in_a_row.store(0, Ordering::Relaxed);
        }
    }

    /// Notes a failed renewal; how many failed in a row, this one included.
    pub(super) fn renewal_failed(&self) -> u64 {
        self.failed_in_a_row.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Requests that saw one expiry together renew one after another (each waits for
    // the lock): only the first renewal begun since what they saw is counted.
    #[tokio::test]
    async fn only_the_first_renewal_since_a_request_saw_the_session_counts() {
        let session = Session::default();
        let together = [session.seen(), session.seen(), session.seen()];
        let firsts: Vec<bool> = {
            let mut firsts = Vec::new();
            for seen in together {
                let (_guard, first) = session.start_renewal(seen).await.expect("not renewed");
                firsts.push(first);
            }
            firsts
        };
        assert_eq!(firsts, [true, false, false]);
        // One that went out after those attempts begins a wave of its own.
        let later = session.seen();
        let (guard, first) = session.start_renewal(later).await.expect("not renewed");
        assert!(first);
        drop(guard);
        // A renewal that succeeded ends the waits of those that saw the session before.
        let stale = session.seen();
        session.renewed();
        assert!(session.start_renewal(stale).await.is_none());
        // Failures in a row, until the session serves or is renewed.
        assert_eq!((session.renewal_failed(), session.renewal_failed()), (1, 2));
        session.served();
        assert_eq!(session.renewal_failed(), 1);
        session.renewed();
        assert_eq!(session.renewal_failed(), 1);
    }
}
