//! The messages of the audit actor.

use ractor::RpcReplyPort;

/// Messages of the audit actor.
pub enum AuditMsg {
    /// Write everything buffered; answer when it is on disk (or the attempt failed).
    Flush(RpcReplyPort<()>),
    /// A batch is full, or the timer fired: write what is buffered.
    Tick,
}
