//! Requests waiting for a server to come back: bounded, released in arrival order,
//! each failed at its own deadline. Plain data, tested without actors.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::ServerError;

/// A reply port for one request. Tokio's own sender, for [`Sender::closed`]: a request
/// whose caller has gone is dropped, on the server too, instead of run for nobody.
///
/// [`Sender::closed`]: tokio::sync::oneshot::Sender::closed
pub type RequestReply = tokio::sync::oneshot::Sender<Result<Value, ServerError>>;

/// A request on its way to the server.
pub struct Outgoing {
    /// The method.
    pub method: String,
    /// Its params.
    pub params: Option<Value>,
    /// `clientCapabilities` for this request; the connection's own when `None`.
    pub capabilities: Option<Value>,
    /// The caller's auth context, for servers that need sign-in.
    pub identity: Option<String>,
    /// The call it is made for ([`crate::transport::RequestOptions::owner`]).
    pub owner: Option<u64>,
    /// When it must be answered by: set where it was made, so that time spent in the
    /// actor's mailbox counts against it.
    pub deadline: Instant,
    /// Asked before a request that waited for its server goes out: false withdraws it
    /// (a call whose grant was revoked meanwhile).
    pub still_wanted: Option<StillWanted>,
}

/// Whether a request waiting for its server is still to be sent.
pub type StillWanted = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

impl Outgoing {
    /// The time left until its deadline.
    pub(super) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// One waiting request.
pub(super) struct Queued {
    pub(super) key: u64,
    pub(super) outgoing: Outgoing,
    pub(super) reply: RequestReply,
    /// Its expiry timer, ended with it: released early, its timer would sleep on to
    /// the deadline (a long `timeout` and a flapping server piled them up).
    _expiry: Option<ExpiryTimer>,
}

/// A request's expiry timer: aborted when dropped.
pub(super) type ExpiryTimer = crate::util::AbortOnDrop;

/// The queue of one server.
pub(super) struct RequestQueue {
    capacity: usize,
    items: VecDeque<Queued>,
    next_key: u64,
}

impl RequestQueue {
    pub(super) fn new(capacity: usize) -> RequestQueue {
        RequestQueue {
            capacity,
            items: VecDeque::new(),
            next_key: 0,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests waiting now.
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// Queues a request, with the expiry timer `arm` starts for its key, and returns
    /// the key; gives its reply port back when the queue is full (of requests whose
    /// callers still wait).
    pub(super) fn push(
        &mut self,
        outgoing: Outgoing,
        reply: RequestReply,
        arm: impl FnOnce(u64) -> Option<ExpiryTimer>,
    ) -> Result<u64, RequestReply> {
        if self.items.len() >= self.capacity {
            self.items.retain(|q| !q.reply.is_closed());
        }
        if self.items.len() >= self.capacity {
            return Err(reply);
        }
        self.next_key += 1;
        self.items.push_back(Queued {
            key: self.next_key,
            outgoing,
            reply,
            _expiry: arm(self.next_key),
        });
        Ok(self.next_key)
    }

    /// Takes the request with `key` out (its deadline passed).
    pub(super) fn expire(&mut self, key: u64) -> Option<Queued> {
        let pos = self.items.iter().position(|q| q.key == key)?;
        self.items.remove(pos)
    }

    /// Takes out the requests whose deadline comes by `at`.
    pub(super) fn due_by(&mut self, at: Instant) -> Vec<Queued> {
        let (due, left) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|q| q.outgoing.deadline <= at);
        self.items = left;
        due.into()
    }

    /// Every waiting request, in arrival order.
    pub(super) fn drain(&mut self) -> Vec<Queued> {
        self.items.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outgoing(ms: u64) -> Outgoing {
        Outgoing {
            method: "m".into(),
            params: None,
            capabilities: None,
            identity: None,
            owner: None,
            deadline: Instant::now() + Duration::from_millis(ms),
            still_wanted: None,
        }
    }

    type Waiting = tokio::sync::oneshot::Receiver<Result<Value, ServerError>>;

    /// A reply port, and its caller waiting on it while the receiver is kept.
    fn port() -> (RequestReply, Waiting) {
        tokio::sync::oneshot::channel()
    }

    #[test]
    fn the_queue_is_bounded_ordered_and_expires_by_key() {
        let mut q = RequestQueue::new(2);
        let (ports, _waiting): (Vec<_>, Vec<_>) = (0..3).map(|_| port()).unzip();
        let mut ports = ports.into_iter();
        let mut next = || ports.next().expect("a port");
        let Ok(a) = q.push(outgoing(10), next(), |_| None) else {
            panic!("room for the first")
        };
        let Ok(b) = q.push(outgoing(20), next(), |_| None) else {
            panic!("room for the second")
        };
        assert!(q.push(outgoing(30), next(), |_| None).is_err(), "full");
        assert_eq!(q.expire(a).map(|x| x.key), Some(a));
        assert!(q.expire(a).is_none(), "gone already");
        let rest: Vec<u64> = q.drain().iter().map(|x| x.key).collect();
        assert_eq!(rest, vec![b]);
    }

    #[tokio::test]
    async fn a_request_taken_out_ends_its_expiry_timer() {
        let mut q = RequestQueue::new(2);
        let (reply, _waiting) = port();
        let timer = tokio::spawn(std::future::pending::<()>());
        let handle = timer.abort_handle();
        let Ok(_) = q.push(outgoing(10), reply, |_| {
            Some(crate::util::AbortOnDrop(handle))
        }) else {
            panic!("room")
        };
        drop(q.drain());
        let ended = timer.await.expect_err("aborted");
        assert!(ended.is_cancelled());
    }

    #[test]
    fn a_request_keeps_the_deadline_it_was_made_with_however_late_it_is_queued() {
        let mut q = RequestQueue::new(2);
        let made = outgoing(10);
        // It sat in the actor's mailbox past its deadline.
        std::thread::sleep(Duration::from_millis(20));
        let (reply, _waiting) = port();
        let Ok(_) = q.push(made, reply, |_| None) else {
            panic!("room")
        };
        let queued = q.drain();
        assert!(queued[0].outgoing.left().is_zero(), "no time left");
    }

    #[test]
    fn a_full_queue_makes_room_from_requests_whose_callers_have_gone() {
        let mut q = RequestQueue::new(2);
        let (gone, _) = port();
        let (kept, _kept_waiting) = port();
        let Ok(_) = q.push(outgoing(10), gone, |_| None) else {
            panic!("room for the first")
        };
        let Ok(b) = q.push(outgoing(10), kept, |_| None) else {
            panic!("room for the second")
        };
        let (third, _third_waiting) = port();
        let Ok(c) = q.push(outgoing(10), third, |_| None) else {
            panic!("the abandoned request made room")
        };
        let rest: Vec<u64> = q.drain().iter().map(|x| x.key).collect();
        assert_eq!(rest, vec![b, c]);
    }
}
