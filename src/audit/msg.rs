//! The messages of the audit actor.

use ractor::RpcReplyPort;

/// Messages of the audit actor.
pub enum AuditMsg {
    /// Write everything buffered; answer when it is on disk (or the attempt failed).
    Flush(RpcReplyPort<()>),
    /// A batch is full: write what is buffered.
    Tick,
    /// The flush timer fired: write what is buffered, and arm it again.
    Timer,
    /// A second after a batch was written but not synced (one had just been): sync it.
    Sync,
}
