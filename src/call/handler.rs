//! Input handlers: how the harness answers what servers ask of the client
//! (`elicitation/create`, `sampling/createMessage`, `roots/list`), whether the question
//! comes as an MRTR input request (modern) or a server-to-client request (legacy).
//!
//! An [`InputHandler`] is registered per method; each runs behind its own
//! [`InputHandlerActor`], which answers every request in its own task (a slow answer
//! holds nothing else up) and enforces a deadline. The registered handlers decide the
//! `clientCapabilities` the harness declares.
//!
//! Built in: [`FixedAnswers`] (the same answer every time, for tests and scripts) and
//! [`ApprovalQueue`] (requests wait in a queue until another task or agent answers).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The boxed future an [`InputHandler`] returns.
pub type InputFuture = Pin<Box<dyn Future<Output = Result<Value, InputError>> + Send>>;

/// One question from a server.
#[derive(Clone, Debug)]
pub struct InputRequestContext {
    /// The server asking.
    pub server: String,
    /// The method, for example `elicitation/create`.
    pub method: String,
    /// The request's params, as sent.
    pub params: Value,
    /// The agent whose call caused it, if any (legacy requests come outside calls).
    pub agent_id: Option<String>,
    /// The MRTR key (empty for legacy requests).
    pub key: String,
}

/// A handler could not answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InputError {
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The handler failed.
    #[error("{0}")]
    Failed(String),
}

/// Answers one kind of input request.
pub trait InputHandler: Send + Sync + 'static {
    /// What this handler adds to `clientCapabilities` under its method's capability
    /// (for elicitation: `{"form": {}}`, `{"url": {}}` or both).
    fn capability(&self) -> Value {
        json!({})
    }

    /// Answers one request: the bare result (for elicitation `{action, content}`).
    fn answer(&self, request: InputRequestContext) -> InputFuture;
}

/// The capability name a method needs.
pub fn capability_name(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// Always gives the same answer (a closure may shape it per request).
pub struct FixedAnswers {
    answer: Arc<dyn Fn(&InputRequestContext) -> Value + Send + Sync>,
    capability: Value,
}

impl FixedAnswers {
    /// Answers every request with `value`.
    pub fn new(value: Value) -> FixedAnswers {
        FixedAnswers {
            answer: Arc::new(move |_| value.clone()),
            capability: json!({"form": {}}),
        }
    }

    /// Answers every request with what `f` returns for it.
    pub fn from_fn(
        f: impl Fn(&InputRequestContext) -> Value + Send + Sync + 'static,
    ) -> FixedAnswers {
        FixedAnswers {
            answer: Arc::new(f),
            capability: json!({"form": {}}),
        }
    }

    /// Declares this capability object instead of `{"form": {}}`.
    pub fn with_capability(mut self, capability: Value) -> FixedAnswers {
        self.capability = capability;
        self
    }
}

impl InputHandler for FixedAnswers {
    fn capability(&self) -> Value {
        self.capability.clone()
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let value = (self.answer)(&request);
        Box::pin(async move { Ok(value) })
    }
}

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

struct QueueInner {
    waiting: Mutex<BTreeMap<u64, (InputRequestContext, oneshot::Sender<Value>)>>,
    next: AtomicU64,
    timeout: Duration,
    notify: tokio::sync::Notify,
}

impl ApprovalQueue {
    /// A queue whose requests fail after `timeout` unanswered.
    pub fn new(timeout: Duration) -> ApprovalQueue {
        ApprovalQueue {
            inner: Arc::new(QueueInner {
                waiting: Mutex::new(BTreeMap::new()),
                next: AtomicU64::new(1),
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
            .map(|(id, (r, _))| PendingInput {
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
            Some((_, tx)) => tx.send(answer).is_ok(),
            None => false,
        }
    }
}

impl InputHandler for ApprovalQueue {
    fn capability(&self) -> Value {
        json!({"form": {}})
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            let id = inner.next.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            inner.waiting.lock().insert(id, (request, tx));
            inner.notify.notify_waiters();
            let outcome = tokio::time::timeout(inner.timeout, rx).await;
            inner.waiting.lock().remove(&id);
            match outcome {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) => Err(InputError::Failed("the approval queue was dropped".into())),
                Err(_) => Err(InputError::Timeout(inner.timeout)),
            }
        })
    }
}

/// Messages of an input handler actor.
pub enum InputMsg {
    /// Answer one request.
    Answer(InputRequestContext, RpcReplyPort<Result<Value, InputError>>),
}

/// Runs one [`InputHandler`] behind a mailbox.
pub struct InputHandlerActor;

/// What an input handler actor holds.
pub struct InputHandlerArgs {
    /// The handler.
    pub handler: Arc<dyn InputHandler>,
    /// Deadline of one answer.
    pub timeout: Duration,
}

impl Actor for InputHandlerActor {
    type Msg = InputMsg;
    type State = InputHandlerArgs;
    type Arguments = InputHandlerArgs;

    async fn pre_start(
        &self,
        _: ActorRef<InputMsg>,
        args: InputHandlerArgs,
    ) -> Result<InputHandlerArgs, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _: ActorRef<InputMsg>,
        msg: InputMsg,
        state: &mut InputHandlerArgs,
    ) -> Result<(), ActorProcessingErr> {
        let InputMsg::Answer(request, reply) = msg;
        let answer = state.handler.answer(request);
        let timeout = state.timeout;
        // Each answer in its own task: a slow human holds up no one else.
        tokio::spawn(async move {
            let result = match tokio::time::timeout(timeout, answer).await {
                Ok(r) => r,
                Err(_) => Err(InputError::Timeout(timeout)),
            };
            let _ = reply.send(result);
        });
        Ok(())
    }
}
