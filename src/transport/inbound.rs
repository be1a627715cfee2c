//! What a transport hands up that is not a reply to one of our requests, and the
//! request ids every transport of one connection draws from.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use serde_json::Value;
use tokio::sync::mpsc;

use super::error::TransportError;
use crate::protocol::{Notification, Request, RequestId};

/// Called by a transport's reader for each `notifications/progress` (its params), in
/// order with the replies: an update the server sent before a result is seen before the
/// result is. It must not block.
#[derive(Clone)]
pub struct ProgressHook(pub Arc<ProgressFn>);

/// The function behind a [`ProgressHook`].
pub type ProgressFn = dyn Fn(Option<&Value>) + Send + Sync;

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// The bytes (as the server sent them) of the messages a connection's inbound channel
/// may hold: one more is taken only within this, or when the channel is empty (so a
/// message of any size that the transport takes still gets through). Counted in
/// messages alone, 256 of them of up to `max_message_bytes` each, parsed (a `Value`
/// can take 16 times its text), could hold tens of GiB while no one drains them, as
/// during the handshake.
pub(crate) const QUEUED_BYTES: usize = 8 << 20;

/// Where a transport's reader hands what is not a reply: the inbound channel, and the
/// progress hook when there is one.
#[derive(Clone)]
pub(crate) struct InboundSink {
    tx: mpsc::Sender<Queued>,
    progress: Option<ProgressHook>,
    /// Bytes of the messages in the channel (and being handled, until they are).
    queued: Arc<AtomicUsize>,
}

/// A message in the inbound channel, with its share of [`QUEUED_BYTES`], given back
/// when it is dropped (handled).
pub(crate) struct Queued {
    pub(crate) message: Inbound,
    pub(crate) charge: Charge,
}

/// Bytes counted against a channel's [`QUEUED_BYTES`] until dropped.
pub(crate) struct Charge {
    bytes: usize,
    queued: Arc<AtomicUsize>,
}

impl Charge {
    /// The message's bytes, as the server sent them.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl InboundSink {
    pub(crate) fn new(tx: mpsc::Sender<Queued>, progress: Option<ProgressHook>) -> InboundSink {
        InboundSink {
            tx,
            progress,
            queued: Arc::default(),
        }
    }

    /// Queues `message`, `bytes` long as the server sent it, unless the channel is full
    /// in messages or in bytes ([`QUEUED_BYTES`]): then it is given back. Progress goes
    /// to the hook instead, at once.
    pub(crate) fn offer(&self, message: Inbound, bytes: usize) -> Result<(), Inbound> {
        if let (Inbound::Notification(n), Some(hook)) = (&message, &self.progress)
            && n.method == "notifications/progress"
        {
            (hook.0)(n.params.as_ref());
            return Ok(());
        }
        let before = self.queued.fetch_add(bytes, Ordering::SeqCst);
        let charge = Charge {
            bytes,
            queued: self.queued.clone(),
        };
        // A small ping is let past the bytes held (still within the channel's count):
        // a server that said much before its handshake's reply still hears `{}`.
        let ping =
            bytes <= PING_BYTES && matches!(&message, Inbound::Request(r, _) if r.method == "ping");
        if before > 0 && before.saturating_add(bytes) > QUEUED_BYTES && !ping {
            return Err(message);
        }
        self.tx
            .try_send(Queued { message, charge })
            .map_err(|e| e.into_inner().message)
    }

    /// Queues the end of the transport, waiting for room.
    pub(crate) async fn send(
        &self,
        message: Inbound,
    ) -> Result<(), mpsc::error::SendError<Queued>> {
        let charge = Charge {
            bytes: 0,
            queued: self.queued.clone(),
        };
        self.tx.send(Queued { message, charge }).await
    }
}

/// The longest ping let past [`QUEUED_BYTES`].
const PING_BYTES: usize = 1024;

/// The answer to a server's request that found no room in the inbound channel: sent at
/// once, so that the server does not wait for one that would never come (and the call
/// it asked during with it).
pub(crate) fn busy() -> crate::protocol::RpcError {
    crate::protocol::RpcError::new(
        crate::protocol::error::INTERNAL_ERROR,
        "the client is too busy to handle this request now; try later",
    )
}

/// Traffic from the server on its own: requests (legacy era), notifications, the end.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A request, and the HTTP request whose event stream carried it.
    Request(Request, Via),
    Notification(Notification),
    Closed(TransportError),
}

/// Which of our HTTP requests' event streams carried a server's request. Stdio, and a
/// session's own stream, carry it on no request of ours (the default).
#[derive(Clone, Debug, Default)]
pub(crate) struct Via {
    /// Its auth context: the server's request is answered as that one, with its token.
    pub(crate) identity: Option<Arc<str>>,
    /// Its id: the server's request came during that one.
    pub(crate) during: Option<RequestId>,
}

/// The ids of one connection's requests: every request, retries included, gets a new one.
#[derive(Clone, Debug)]
pub(crate) struct Ids(Arc<AtomicI64>);

impl Ids {
    pub(crate) fn new() -> Ids {
        Ids(Arc::new(AtomicI64::new(1)))
    }

    pub(crate) fn next(&self) -> RequestId {
        RequestId::Number(self.0.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_that_finds_no_room_is_given_back_whole() {
        let (tx, _rx) = mpsc::channel(1);
        let sink = InboundSink::new(tx, None);
        let request = |id: i64| Request {
            id: RequestId::Number(id),
            method: "roots/list".into(),
            params: None,
        };
        assert!(
            sink.offer(Inbound::Request(request(1), Via::default()), 10)
                .is_ok()
        );
        // The transport answers it itself: it needs the id and whose it was.
        let via = Via {
            identity: Some("alice".into()),
            during: Some(RequestId::Number(7)),
        };
        match sink.offer(Inbound::Request(request(2), via), 10) {
            Err(Inbound::Request(r, via)) => {
                assert_eq!(r.id, RequestId::Number(2));
                assert_eq!(via.identity.as_deref(), Some("alice"));
                assert_eq!(via.during, Some(RequestId::Number(7)));
            }
            _ => panic!("the second has no room"),
        }
        // Its bytes are not kept counted.
        assert_eq!(sink.queued.load(Ordering::SeqCst), 10);
    }
}
