//! What a transport hands up that is not a reply to one of our requests, and the
//! request ids every transport of one connection draws from.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use super::error::TransportError;
use crate::protocol::{Notification, Request, RequestId};

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
