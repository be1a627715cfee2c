//! The messages of a server actor: from callers (through [`super::ServerRef`]), from its
//! connection actor, and from its own timers.

use std::sync::Arc;

use ractor::RpcReplyPort;

use super::queue::{Outgoing, RequestReply};
use crate::transport::{Connection, ServerEvent, TransportError};

/// Messages of a server actor.
pub enum ServerMsg {
    /// Send one request (the `_meta` envelope is added by the connection) and answer
    /// through `reply`; from [`ServerRef::request`] while the server is not ready.
    Request {
        /// The request.
        outgoing: Outgoing,
        /// Where the result goes.
        reply: RequestReply,
    },
    /// Restart now, forgetting the restart history (brings a `failed` server back).
    Restart(RpcReplyPort<()>),
    /// Stop gracefully: fail queued requests, shut the connection down, stop.
    Shutdown(RpcReplyPort<()>),
    /// The client's capabilities changed: a legacy server gets a new connection.
    CapabilitiesChanged,
    /// Panics in the handler: a test's stand-in for a bug in the actor.
    #[cfg(test)]
    Panic,
    /// From the connection actor: connected.
    ConnectionUp {
        /// Which connection attempt.
        attempt: u64,
        /// The connection.
        conn: Arc<Connection>,
    },
    /// From a request: the server refused the connection (HTTP), so it is down.
    ConnectionLost {
        /// Which connection attempt.
        attempt: u64,
        /// What happened.
        error: TransportError,
    },
    /// From the connection actor: the server's own traffic.
    Inbound {
        /// Which connection attempt.
        attempt: u64,
        /// The event.
        event: ServerEvent,
    },
    /// From a backoff timer: start connection attempt `attempt + 1`.
    StartConnection {
        /// The attempt the timer was set in; stale timers are ignored.
        attempt: u64,
    },
    /// From a timer: a queued request reached its deadline.
    ExpireQueued(u64),
    /// From a timer: pass on the `list_changed` notifications gathered since the last.
    FlushListsChanged,
}
