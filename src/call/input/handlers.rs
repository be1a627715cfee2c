//! [`InputHandlers`]: the one owner of the registered handlers. It holds the handler of
//! each method and the `clientCapabilities` they add up to, published as a snapshot
//! that calls and servers read without a mailbox; changes go through the
//! [`InputHandlersActor`], which also tells the servers (a connected legacy server
//! reconnects to learn them). The snapshot lives outside the actor: a rebuilt actor
//! keeps every handler.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Map, Value};

use super::{InputError, InputHandler, InputRequestContext, capability_name};
use crate::server::ServersRef;
use crate::util::invalid::Invalid;
use crate::util::slot::ActorSlot;

/// The handlers at one moment, and the capabilities they declare.
pub struct HandlerSet {
    by_method: HashMap<String, Arc<dyn InputHandler>>,
    capabilities: Value,
    /// A digest of the capabilities and the protocol versions offered with them.
    tag: String,
}

impl HandlerSet {
    fn build(by_method: HashMap<String, Arc<dyn InputHandler>>) -> HandlerSet {
        let mut caps = Map::new();
        // In the methods' order: the digest must not follow a map's random order (nor
        // a `serde_json` that keeps insertion order, if a dependency asks for it).
        let mut methods: Vec<_> = by_method.iter().collect();
        methods.sort_by(|a, b| a.0.cmp(b.0));
        for (method, handler) in methods {
            if let Some(name) = capability_name(method) {
                caps.insert(name.to_string(), handler.capability());
            }
        }
        let capabilities = Value::Object(caps);
        HandlerSet {
            by_method,
            tag: client_tag(&capabilities),
            capabilities,
        }
    }

    /// `clientCapabilities` as these handlers declare them.
    pub fn capabilities(&self) -> &Value {
        &self.capabilities
    }

    /// What a server is told of its client, as a short digest: the capabilities and
    /// the protocol versions offered. A server may list by them, so cached lists are
    /// keyed by it, in every layer and across restarts.
    pub fn client_tag(&self) -> &str {
        &self.tag
    }

    /// The handler of `method`.
    pub fn get(&self, method: &str) -> Option<&Arc<dyn InputHandler>> {
        self.by_method.get(method)
    }
}

/// [`HandlerSet::client_tag`] of `capabilities`: the same in every process that
/// declares the same (capabilities are put in the methods' order).
fn client_tag(capabilities: &Value) -> String {
    use crate::protocol::meta::{LEGACY_VERSIONS, MODERN};
    let declared = serde_json::json!([MODERN, LEGACY_VERSIONS, capabilities]).to_string();
    let mut digest = crate::util::hash::sha256_hex(declared.as_bytes());
    digest.truncate(16);
    digest
}

/// The registered handlers; cheap to clone (every clone sees the same set).
#[derive(Clone)]
pub struct InputHandlers {
    current: Arc<RwLock<Arc<HandlerSet>>>,
    pub(crate) actor: ActorSlot<InputHandlersMsg>,
    timeout: Duration,
}

fn check_method(method: &str) -> Result<(), Invalid> {
    match capability_name(method) {
        Some(_) => Ok(()),
        None => Err(Invalid::new(
            "input_handlers",
            format!(
                "no input method {method:?}; use elicitation/create, sampling/createMessage or roots/list"
            ),
        )),
    }
}

impl InputHandlers {
    /// Handlers known before any server connects (so that legacy servers learn their
    /// capabilities at `initialize`), each answer bounded by `timeout`.
    pub fn new(
        initial: Vec<(String, Arc<dyn InputHandler>)>,
        timeout: Duration,
    ) -> Result<InputHandlers, Invalid> {
        let mut by_method = HashMap::new();
        for (method, handler) in initial {
            check_method(&method)?;
            by_method.insert(method, handler);
        }
        Ok(InputHandlers {
            current: Arc::new(RwLock::new(Arc::new(HandlerSet::build(by_method)))),
            actor: ActorSlot::default(),
            timeout,
        })
    }

    /// The handlers now.
    pub fn snapshot(&self) -> Arc<HandlerSet> {
        self.current.read().clone()
    }

    /// The longest one answer may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Registers (or replaces) the handler of `method`; the servers learn the new
    /// capabilities (a connected legacy server reconnects, without failing a call).
    pub async fn register(
        &self,
        method: &str,
        handler: Arc<dyn InputHandler>,
    ) -> Result<(), Invalid> {
        check_method(method)?;
        let done = self
            .actor
            .ask(
                |reply| InputHandlersMsg::Register(method.to_string(), handler.clone(), reply),
                Duration::from_secs(10),
            )
            .await;
        done.ok_or_else(|| Invalid::new("input_handlers", "the harness is shutting down"))
    }

    fn set(&self, method: String, handler: Arc<dyn InputHandler>) {
        let mut current = self.current.write();
        let mut by_method = current.by_method.clone();
        by_method.insert(method, handler);
        *current = Arc::new(HandlerSet::build(by_method));
    }

    /// Answers one request with the handler of its method, in a task of its own,
    /// within `limit` (and never past the handlers' own timeout). Dropping the future
    /// aborts the handler (an [`super::ApprovalQueue`] entry leaves the queue).
    pub async fn answer(
        &self,
        set: &HandlerSet,
        mut request: InputRequestContext,
        limit: Duration,
    ) -> Result<Value, InputError> {
        let Some(handler) = set.get(&request.method).cloned() else {
            return Err(InputError::NoHandler(request.method));
        };
        let limit = limit.min(self.timeout);
        // The call's deadline too: a legacy server's question is given the handlers'
        // whole timeout, and its call may end sooner.
        request.answer_by = match std::time::Instant::now().checked_add(limit) {
            Some(by) => Some(request.call_deadline.map_or(by, |d| by.min(d))),
            None => request.call_deadline,
        };
        let task = tokio::spawn(async move { handler.answer(request).await });
        // Its answer is no longer awaited once this is dropped.
        let _abort = crate::util::AbortOnDrop(task.abort_handle());
        match tokio::time::timeout(limit, task).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) if e.is_panic() => Err(InputError::Failed("the handler panicked".into())),
            Ok(Err(_)) => Err(InputError::Failed("the handler was stopped".into())),
            Err(_) => Err(InputError::Timeout(limit)),
        }
    }
}

/// Messages of the input handlers' owner.
pub enum InputHandlersMsg {
    /// Register (or replace) the handler of a method.
    Register(String, Arc<dyn InputHandler>, RpcReplyPort<()>),
}

/// What the owner actor is started with (and rebuilt from).
#[derive(Clone)]
pub struct InputHandlersArgs {
    pub(crate) handlers: InputHandlers,
    pub(crate) servers: ServersRef,
}

/// Owns changes to the handlers; see the module docs.
pub struct InputHandlersActor;

impl Actor for InputHandlersActor {
    type Msg = InputHandlersMsg;
    type State = InputHandlersArgs;
    type Arguments = InputHandlersArgs;

    async fn pre_start(
        &self,
        _: ActorRef<InputHandlersMsg>,
        args: InputHandlersArgs,
    ) -> Result<InputHandlersArgs, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _: ActorRef<InputHandlersMsg>,
        msg: InputHandlersMsg,
        state: &mut InputHandlersArgs,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            InputHandlersMsg::Register(method, handler, reply) => {
                tracing::info!(%method, "input handler registered");
                state.handlers.set(method, handler);
                state.servers.capabilities_changed();
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Tells when it was told its answer is due.
    struct Due(parking_lot::Mutex<Vec<Option<Instant>>>);

    impl InputHandler for Due {
        fn answer(&self, request: InputRequestContext) -> super::super::InputFuture {
            self.0.lock().push(request.answer_by);
            Box::pin(async { Ok(serde_json::json!({})) })
        }
    }

    fn asked(call_deadline: Option<Instant>) -> InputRequestContext {
        InputRequestContext {
            server: "s".into(),
            method: "elicitation/create".into(),
            params: serde_json::json!({}),
            agent_id: Some("a".into()),
            key: String::new(),
            call_id: Some(1),
            call_deadline,
            shared: false,
            answer_by: None,
        }
    }

    /// A handler is told its answer is due at its limit, or at its call's deadline if
    /// that comes first (a legacy server's question is given the whole timeout).
    #[tokio::test]
    async fn an_answer_is_due_by_the_handlers_limit_or_the_calls_deadline() {
        let due = Arc::new(Due(parking_lot::Mutex::default()));
        let inputs = InputHandlers::new(
            vec![(
                "elicitation/create".into(),
                due.clone() as Arc<dyn InputHandler>,
            )],
            Duration::from_secs(300),
        )
        .expect("handlers");
        let set = inputs.snapshot();
        let ends = Instant::now() + Duration::from_secs(5);
        let limit = Duration::from_secs(300);
        inputs
            .answer(&set, asked(Some(ends)), limit)
            .await
            .expect("answered");
        let before = Instant::now();
        inputs
            .answer(&set, asked(None), Duration::from_secs(7))
            .await
            .expect("answered");
        let after = Instant::now();
        let told = due.0.lock().clone();
        assert_eq!(
            told[0],
            Some(ends),
            "the call's deadline, sooner than the limit"
        );
        let by = told[1].expect("a due time");
        assert!(
            by >= before + Duration::from_secs(7) && by <= after + Duration::from_secs(7),
            "the limit from when it was asked"
        );
        // A limit past what an instant can hold: the call's deadline all the same.
        let endless = InputHandlers::new(
            vec![(
                "elicitation/create".into(),
                due.clone() as Arc<dyn InputHandler>,
            )],
            Duration::MAX,
        )
        .expect("handlers");
        let set = endless.snapshot();
        (endless.answer(&set, asked(Some(ends)), Duration::MAX).await).expect("answered");
        assert_eq!(due.0.lock().last().copied().flatten(), Some(ends));
    }
}
