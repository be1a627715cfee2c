//! Small helpers that any layer may use: duration parsing, hashing, invalid settings,
//! the slot of a rebuilt actor, outside text made fit for a message, the W3C trace
//! context of the current span, a pipe writer's pause before a burst. Leaves: they
//! import nothing else from the crate.

pub mod duration;
pub mod hash;
pub mod invalid;
#[cfg(test)]
pub(crate) mod scratch;
pub mod slot;
pub mod text;
pub mod trace_context;

/// A pipe writer's pause between waking and draining its queue: the tasks that are
/// ready now (the callers woken by one read of responses) queue their lines first, so
/// that the burst goes out in one write instead of one write each. Measured on the
/// stdio bench at 64 in flight: 0.8 writes per call before, 0.15 after.
pub(crate) async fn gather_burst() {
    tokio::task::yield_now().await;
}
