//! [`ApprovalQueue`]: elicitation answered by someone else. Requests wait in the queue
//! until [`ApprovalQueue::answer`] or their timeout; a request whose call goes away
//! (cancelled, timed out, the harness shut down) leaves the queue at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{InputError, InputFuture, InputHandler, InputRequestContext};

/// A request waiting in an [`ApprovalQueue`].
#[derive(Clone, Debug)]
pub struct PendingInput {
    /// Queue-local id, for [`ApprovalQueue::answer`].
    pub id: u64,
    /// The request.
    pub request: InputRequestContext,
}

/// Elicitation answered by someone else: requests wait until [`ApprovalQueue::answer`]
/// or their timeout.
#[derive(Clone)]
pub struct ApprovalQueue {
    inner: Arc<QueueInner>,
}

/// Requests waiting at most, in all and per agent: an agent whose calls keep asking (or
/// a server asking for them) fills neither the queue nor the people's view of it.
pub const MAX_WAITING: usize = 256;
/// See [`MAX_WAITING`].
pub const MAX_WAITING_PER_AGENT: usize = 32;
/// See [`MAX_WAITING`]: one server asking on many agents' calls cannot fill the queue
/// for every other server either.
pub const MAX_WAITING_PER_SERVER: usize = 64;
/// The largest elicitation (its params, as JSON) that waits for a person: a form a
/// person reads is small, and what waits is copied for each look at the queue.
pub const MAX_WAITING_BYTES: usize = 256 << 10;
/// The largest sampling request that waits (its messages may carry an image).
pub const MAX_WAITING_SAMPLING_BYTES: usize = 4 << 20;
/// What all waiting requests may come to together.
pub const MAX_WAITING_TOTAL_BYTES: usize = 64 << 20;

/// Each waiting request, where its answer goes, and its size.
type Waiting = BTreeMap<u64, (InputRequestContext, oneshot::Sender<Value>, usize)>;

struct QueueInner {
    waiting: Mutex<Waiting>,
    next: AtomicU64,
    timeout: Duration,
    notify: tokio::sync::Notify,
}

/// Takes a request out of the queue when its answer is no longer awaited.
struct Withdraw {
    inner: Arc<QueueInner>,
    id: u64,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.inner.waiting.lock().remove(&self.id);
    }
}

impl ApprovalQueue {
    /// A queue whose requests fail after `timeout` unanswered.
    pub fn new(timeout: Duration) -> ApprovalQueue {
        ApprovalQueue {
            inner: Arc::new(QueueInner {
                waiting: Mutex::new(BTreeMap::new()),
                // Not from 1 in every run: an id read from one run's queue and typed
                // after a restart must not answer another run's request.
                next: AtomicU64::new(crate::util::random_start()),
                timeout,
                notify: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The requests waiting now, oldest first.
    pub fn pending(&self) -> Vec<PendingInput> {
        self.inner
            .waiting
            .lock()
            .iter()
            .map(|(id, (r, _, _))| PendingInput {
                id: *id,
                request: r.clone(),
            })
            .collect()
    }

    /// Waits until at least one request is pending and returns them.
    pub async fn next_pending(&self) -> Vec<PendingInput> {
        loop {
            let notified = self.inner.notify.notified();
            let pending = self.pending();
            if !pending.is_empty() {
                return pending;
            }
            notified.await;
        }
    }

    /// Answers request `id`; false when it is no longer waiting.
    pub fn answer(&self, id: u64, answer: Value) -> bool {
        match self.inner.waiting.lock().remove(&id) {
            Some((_, tx, _)) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    /// Declines request `id`; false when it is no longer waiting.
    pub fn decline(&self, id: u64) -> bool {
        self.answer(id, json!({"action": "decline"}))
    }
}

impl InputHandler for ApprovalQueue {
    fn capability(&self) -> Value {
        json!({"form": {}})
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            let size = crate::registry::cache::json_size(&request.params);
            let most = match request.method.as_str() {
                "sampling/createMessage" => MAX_WAITING_SAMPLING_BYTES,
                _ => MAX_WAITING_BYTES,
            };
            if size > most {
                return Err(InputError::Failed(format!(
                    "the request is too large to wait for a person (over {} KiB)",
                    most >> 10
                )));
            }
            let id = inner.next.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            {
                let mut waiting = inner.waiting.lock();
                let agent = request.agent_id.as_deref();
                let (mut theirs, mut its, mut bytes) = (0, 0, size);
                for (r, _, b) in waiting.values() {
                    theirs += usize::from(r.agent_id.as_deref() == agent);
                    its += usize::from(r.server == request.server);
                    bytes = bytes.saturating_add(*b);
                }
                if waiting.len() >= MAX_WAITING
                    || theirs >= MAX_WAITING_PER_AGENT
                    || its >= MAX_WAITING_PER_SERVER
                    || bytes > MAX_WAITING_TOTAL_BYTES
                {
                    return Err(InputError::Failed(
                        "too many requests await approval; try later".into(),
                    ));
                }
                waiting.insert(id, (request, tx, size));
            }
            let _withdraw = Withdraw {
                inner: inner.clone(),
                id,
            };
            inner.notify.notify_waiters();
            match tokio::time::timeout(inner.timeout, rx).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) => Err(InputError::Failed("the approval queue was dropped".into())),
                Err(_) => Err(InputError::Timeout(inner.timeout)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked_by(agent: &str) -> InputRequestContext {
        asked_of(agent, "s")
    }

    fn asked_of(agent: &str, server: &str) -> InputRequestContext {
        InputRequestContext {
            server: server.into(),
            method: "elicitation/create".into(),
            params: json!({"message": "?"}),
            agent_id: Some(agent.into()),
            key: "k".into(),
            call_id: Some(1),
            call_deadline: None,
            shared: false,
            answer_by: None,
        }
    }

    /// Until `n` requests wait in `queue` (a test failure, not a hang, if they never do).
    async fn waits_for(queue: &ApprovalQueue, n: usize) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while queue.pending().len() < n {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(waited.is_ok(), "{} waiting, not {n}", queue.pending().len());
    }

    #[tokio::test]
    async fn an_agent_fills_neither_the_queue_nor_its_share_past_the_bounds() {
        let queue = ApprovalQueue::new(Duration::from_secs(60));
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..MAX_WAITING_PER_AGENT {
            waiting.spawn(InputHandler::answer(&queue, asked_by("a")));
        }
        waits_for(&queue, MAX_WAITING_PER_AGENT).await;
        let refused = InputHandler::answer(&queue, asked_by("a")).await;
        assert!(matches!(refused, Err(InputError::Failed(_))), "{refused:?}");
        // Another agent still gets a place, up to the queue's own bound.
        for i in 0..(MAX_WAITING - MAX_WAITING_PER_AGENT) {
            waiting.spawn(InputHandler::answer(
                &queue,
                asked_of(&format!("b{}", i % 8), &format!("t{}", i % 8)),
            ));
        }
        waits_for(&queue, MAX_WAITING).await;
        let refused = InputHandler::answer(&queue, asked_of("c", "u")).await;
        assert!(matches!(refused, Err(InputError::Failed(_))), "{refused:?}");
        // An answer makes room again.
        let first = queue.pending()[0].id;
        assert!(queue.decline(first));
        waiting.spawn(InputHandler::answer(&queue, asked_of("c", "u")));
        waits_for(&queue, MAX_WAITING).await;
        waiting.abort_all();
    }

    #[tokio::test]
    async fn a_request_too_large_for_a_person_to_read_does_not_wait() {
        let queue = ApprovalQueue::new(Duration::from_secs(60));
        let mut large = asked_by("a");
        large.params = json!({"message": "x".repeat(MAX_WAITING_BYTES)});
        let refused = InputHandler::answer(&queue, large).await;
        assert!(matches!(refused, Err(InputError::Failed(_))), "{refused:?}");
        assert!(queue.pending().is_empty());
        // A sampling request with an image of that size waits.
        let mut image = asked_by("a");
        image.method = "sampling/createMessage".into();
        image.params = json!({"messages": [{"role": "user", "content": {"type": "image", "data": "A".repeat(MAX_WAITING_BYTES), "mimeType": "image/png"}}]});
        let waiting = tokio::spawn(InputHandler::answer(&queue, image));
        waits_for(&queue, 1).await;
        waiting.abort();
    }

    #[tokio::test]
    async fn one_server_asking_for_many_agents_keeps_other_servers_in() {
        let queue = ApprovalQueue::new(Duration::from_secs(60));
        let mut waiting = tokio::task::JoinSet::new();
        for i in 0..MAX_WAITING_PER_SERVER {
            waiting.spawn(InputHandler::answer(
                &queue,
                asked_of(&format!("a{}", i % 8), "evil"),
            ));
        }
        waits_for(&queue, MAX_WAITING_PER_SERVER).await;
        let refused = InputHandler::answer(&queue, asked_of("fresh", "evil")).await;
        assert!(matches!(refused, Err(InputError::Failed(_))), "{refused:?}");
        waiting.spawn(InputHandler::answer(&queue, asked_of("a0", "good")));
        waits_for(&queue, MAX_WAITING_PER_SERVER + 1).await;
        waiting.abort_all();
    }
}
