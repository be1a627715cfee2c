//! What a transport hands up that is not a reply to one of our requests, and the
//! request ids every transport of one connection draws from.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

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

/// Where a transport's reader hands what is not a reply: the inbound channel, and the
/// progress hook when there is one.
#[derive(Clone)]
pub(crate) struct InboundSink {
    tx: mpsc::Sender<Inbound>,
    progress: Option<ProgressHook>,
}

impl InboundSink {
    pub(crate) fn new(tx: mpsc::Sender<Inbound>, progress: Option<ProgressHook>) -> InboundSink {
        InboundSink { tx, progress }
    }

    /// As [`mpsc::Sender::try_send`]; progress goes to the hook instead, at once.
    pub(crate) fn try_send(
        &self,
        message: Inbound,
    ) -> Result<(), mpsc::error::TrySendError<Inbound>> {
        if let (Inbound::Notification(n), Some(hook)) = (&message, &self.progress)
            && n.method == "notifications/progress"
        {
            (hook.0)(n.params.as_ref());
            return Ok(());
        }
        self.tx.try_send(message)
    }

    /// As [`mpsc::Sender::send`].
    pub(crate) async fn send(
        &self,
        message: Inbound,
    ) -> Result<(), mpsc::error::SendError<Inbound>> {
        self.tx.send(message).await
    }
}

/// Traffic from the server on its own: requests (legacy era), notifications, the end.
#[derive(Debug)]
pub(crate) enum Inbound {
    Request(Request),
    Notification(Notification),
    Closed(TransportError),
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
