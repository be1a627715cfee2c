//! The messages of a server actor: from callers (through [`super::ServerRef`]), from its
//! connection actor, and from its own timers.

use std::sync::Arc;

use ractor::RpcReplyPort;

use super::client::ListsChanged;
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
    /// From a timer: try again the new connection a failed handover was to make.
    RetryHandover,
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
        /// For a `list_changed`, its place on the way (given back when this message
        /// is dropped, once handled).
        queued: Option<Queued>,
    },
    /// From a backoff timer: start the next connection attempt (numbered by the
    /// server's shared counter).
    StartConnection {
        /// The attempt the timer was set in; stale timers are ignored.
        attempt: u64,
    },
    /// The server this one replaces has stopped: the first connection may start.
    PredecessorStopped,
    /// From a timer: a queued request reached its deadline.
    ExpireQueued(u64),
    /// From a timer: pass on the `list_changed` notifications gathered since the last.
    FlushListsChanged,
}

/// The `list_changed` notifications of one source (a connection, a listener) on their
/// way to the server actor: at most one of each list. The actors' mailboxes have no
/// bound, and one on its way marks its list when it is handled, so the others of a
/// flood would add nothing but memory.
#[derive(Clone, Default)]
pub(crate) struct OnTheWay(Arc<parking_lot::Mutex<ListsChanged>>);

/// One `list_changed` on its way: its list may go again once this is dropped.
pub struct Queued {
    on_the_way: OnTheWay,
    list: ListsChanged,
}

impl OnTheWay {
    /// A place for a notification of `method`, or `None` when one of its list is on
    /// its way already (or `method` is no `list_changed`).
    pub(crate) fn take(&self, method: &str) -> Option<Queued> {
        let mut list = ListsChanged::default();
        if !list.mark(method) {
            return None;
        }
        let mut queued = self.0.lock();
        if queued.union(list) == *queued {
            return None;
        }
        *queued = queued.union(list);
        Some(Queued {
            on_the_way: self.clone(),
            list,
        })
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut queued = self.on_the_way.0.lock();
        *queued = queued.without(self.list);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_list_changed_of_each_list_is_on_its_way_at_a_time() {
        let on_the_way = OnTheWay::default();
        let tools = on_the_way.take("notifications/tools/list_changed");
        assert!(tools.is_some());
        assert!(
            on_the_way
                .take("notifications/tools/list_changed")
                .is_none()
        );
        // Another list is not held up by this one.
        let prompts = on_the_way.take("notifications/prompts/list_changed");
        assert!(prompts.is_some());
        assert!(on_the_way.take("notifications/message").is_none());
        // Handled: its list may go again.
        drop(tools);
        assert!(
            on_the_way
                .take("notifications/tools/list_changed")
                .is_some()
        );
        assert!(
            on_the_way
                .take("notifications/prompts/list_changed")
                .is_none()
        );
    }
}
