//! Small helpers that any layer may use: duration parsing, hashing, invalid settings,
//! advisory file locks, file work handed off by a runtime worker while it blocks, a log
//! budget against floods, a secret read from an operator's file, the slot of a rebuilt
//! actor, outside text made fit for a message, the W3C trace context of the current
//! span, a pipe writer's pause before a burst. Leaves: they import nothing else from
//! the crate.

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

/// Runs `f`, which blocks on the file system (a file synced, a directory read), so that
/// a multi-threaded runtime's worker that calls it hands its other tasks to another
/// worker meanwhile (`block_in_place`). Elsewhere (no runtime, a current-thread one, a
/// thread `block_in_place` refuses, one already unwinding) `f` simply runs here. A
/// panic in `f` goes on as it was. A refusal is tokio's panic, caught: the panic hook
/// still sees it (and prints it), and under `panic = "abort"` it aborts.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let multi_threaded = matches!(
        tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()),
        Ok(tokio::runtime::RuntimeFlavor::MultiThread)
    );
    let mut f = Some(f);
    if multi_threaded && !std::thread::panicking() {
        let mut out = None;
        // `block_in_place` refuses some threads of such a runtime (one inside a
        // `LocalSet`, say) by panicking before it runs anything: `f` is then still here.
        let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokio::task::block_in_place(|| out = f.take().map(|f| f()))
        }));
        match (out, tried) {
            (Some(out), _) => return out,
            (None, Err(panic)) if f.is_none() => std::panic::resume_unwind(panic),
            _ => {}
        }
    }
    match f {
        Some(f) => f(),
        // Unreachable: `f` is taken only by a run that returned or panicked above.
        None => unreachable!("a blocking closure taken without a result"),
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
    fn a_blocking_closure_runs_once_on_any_thread_and_its_panic_goes_on() {
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let run = || {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            7
        };
        assert_eq!(super::blocking(run), 7);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        assert_eq!(current.block_on(async { super::blocking(run) }), 7);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .expect("runtime");
        assert_eq!(
            multi
                .block_on(async { tokio::spawn(async move { super::blocking(|| 8) }).await })
                .expect("task"),
            8
        );
        // Inside a `LocalSet` on a multi-threaded runtime `block_in_place` refuses.
        let local = tokio::task::LocalSet::new();
        assert_eq!(local.block_on(&multi, async { super::blocking(run) }), 7);
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
        let panicked = multi.block_on(async {
            tokio::spawn(async { super::blocking(|| -> u8 { panic!("inside") }) }).await
        });
        assert!(panicked.is_err_and(|e| e.is_panic()));
    }

    #[test]
    fn numbers_start_at_random_within_a_json_readers_exact_integers() {
        let (a, b) = (super::random_start(), super::random_start());
        assert_ne!(a, b, "two runs number alike");
        assert!(a < 1 << 52 && b < 1 << 52 && a > 0 && b > 0);
    }
}
