//! Small helpers that any layer may use: duration parsing, hashing, invalid settings,
//! advisory file locks, a log budget against floods, a secret read from an operator's file, the slot of a rebuilt actor, outside text made fit for a message, the W3C trace
//! context of the current span, a pipe writer's pause before a burst. Leaves: they
//! import nothing else from the crate.

pub mod duration;
pub mod hash;
pub mod invalid;
pub mod lock;
pub mod log_budget;
#[cfg(test)]
pub(crate) mod scratch;
pub mod secret;
pub mod slot;
pub mod text;
pub mod trace_context;

/// A random 52-bit start for numbers a process hands out (a JSON reader's exact
/// integers go to 2^53), so that two runs do not number alike: call ids in one audit
/// file, approval ids a person types (`approvals accept 3` reaching another run's 3).
/// From 1 without randomness.
pub fn random_start() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    (u64::from_le_bytes(bytes) >> 12).max(1)
}

/// Creates `path` and the directories missing above it, each this user's alone (0700,
/// whatever the umask lets others have): what the harness keeps there (an audit
/// trail, tokens, cached lists, keys) must not be removed or replaced by another user
/// or a member of the group.
pub fn private_dirs(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// Aborts a task when dropped: for a task whose outcome nobody awaits any more, or
/// that must not outlive the future that started it (an embedder may drop that one).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A pipe writer's pause between waking and draining its queue. It yields once, so
/// that it runs again after the tasks its worker has ready (the callers woken by one
/// read of responses, each queueing a line), or at the scheduler's next maintenance
/// tick, at most 61 polls later: the burst goes out in one write instead of one write
/// each. BENCHMARKS.md (item 10) has the write calls it saves. Writers pause only
/// when a burst is coming (several answers delivered, other calls running): alone, a
/// line gains nothing by the pause and pays a driver pass and another worker's wake-up
/// for it (item 18).
pub(crate) async fn gather_burst() {
    tokio::task::yield_now().await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_start_at_random_within_a_json_readers_exact_integers() {
        let (a, b) = (super::random_start(), super::random_start());
        assert_ne!(a, b, "two runs number alike");
        assert!(a < 1 << 52 && b < 1 << 52 && a > 0 && b > 0);
    }
}
