//! `ServerActor`: one per MCP server, with a stable address for its whole life. It
//! supervises the server's `ConnectionActor`, applies the restart policy when the
//! connection ends, holds requests while the server (re)starts, and answers
//! [`ServerStatus`] through a shared cell.
//!
//! Requests never wait on the actor: when the server is ready, each request runs in its
//! own task on the shared connection, so one slow call holds nothing else up. While the
//! server starts or restarts, requests wait in a bounded queue (released in order when it
//! is ready, failed with `Restarting` at their deadline, or refused with `Overloaded`
//! past the bound). A `failed` or `stopped` server answers at once.
//!
//! Failure: a stdio process exit reaches in-flight requests through the transport
//! (`TransportClosed`, at once) and this actor through its child's failure. An HTTP
//! server that refuses connections is treated as down the same way. A modern server
//! that shares no version with us is `failed` at once, not retried in a loop.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;

use super::connection_actor::{ConnArgs, ConnMsg, ConnectionActor, ConnectionFailure};
use super::error::ServerError;
use super::hooks::ServerHooks;
use super::restart::{Decision, ExitKind, RestartTracker};
use super::status::{ServerState, ServerStatus};
use crate::call::handler::{InputMsg, InputRequestContext};
use crate::config::ServerConfig;
use crate::protocol::RpcError;
use crate::protocol::error::{INTERNAL_ERROR, METHOD_NOT_FOUND};
use crate::registry::RegistryMsg;
use crate::transport::{
    ConnectError, ConnectOptions, Connection, RequestError, ServerEvent, ServerRequest,
    TransportError,
};

/// A reply port for one request.
pub type RequestReply = RpcReplyPort<Result<Value, ServerError>>;

/// Messages of a server actor.
pub enum ServerMsg {
    /// Send one request (the `_meta` envelope is added by the connection) and answer
    /// through `reply`. `timeout` overrides the server's configured deadline.
    Request {
        /// The method.
        method: String,
        /// Its params.
        params: Option<Value>,
        /// Deadline of this request; the server's `timeout` when `None`.
        timeout: Option<Duration>,
        /// `clientCapabilities` for this request; the connection's own when `None`.
        capabilities: Option<Value>,
        /// Where the result goes.
        reply: RequestReply,
    },
    /// Restart now, forgetting the restart history (brings a `failed` server back).
    Restart(RpcReplyPort<()>),
    /// Stop gracefully: fail queued requests, shut the connection down, stop.
    Shutdown(RpcReplyPort<()>),
    /// From the connection actor: connected.
    ConnectionUp {
        /// Which connection attempt.
        generation: u64,
        /// The connection.
        conn: Arc<Connection>,
    },
    /// From a request task: the server refused the connection (HTTP), so it is down.
    ConnectionLost {
        /// Which connection attempt.
        generation: u64,
        /// What happened.
        error: String,
    },
    /// From the connection actor: the server's own traffic.
    Inbound {
        /// Which connection attempt.
        generation: u64,
        /// The event.
        event: ServerEvent,
    },
    /// From a backoff timer: start connection attempt `generation + 1`.
    StartConnection {
        /// The generation the timer was set in; stale timers are ignored.
        generation: u64,
    },
    /// From a timer: a queued request reached its deadline.
    ExpireQueued(u64),
}

/// Everything needed to (re)build a server actor.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The server's configuration.
    pub config: ServerConfig,
    /// How its connections are opened.
    pub options: ConnectOptions,
    /// Capabilities, input handlers, registry.
    pub hooks: ServerHooks,
}

/// What a server actor is started with.
pub struct ServerArgs {
    /// The spec.
    pub spec: ServerSpec,
    /// The shared status cell the actor writes.
    pub status: Arc<RwLock<ServerStatus>>,
    /// The ready connection, published for requests that need no queueing.
    pub live: LiveSlot,
}

/// A ready connection, and the attempt it belongs to.
#[derive(Clone)]
pub struct LiveConnection {
    /// The connection.
    pub conn: Arc<Connection>,
    /// Its connection attempt.
    pub generation: u64,
}

/// Where a server actor publishes its ready connection (`None` while not ready). While a
/// server is ready, requests run on it straight from the caller's task: the actor's
/// mailbox is for lifecycle, queueing and failures, not for every call.
pub type LiveSlot = Arc<RwLock<Option<LiveConnection>>>;

/// A request on its way to the server.
struct Outgoing {
    method: String,
    params: Option<Value>,
    capabilities: Option<Value>,
}

struct Queued {
    key: u64,
    outgoing: Outgoing,
    timeout: Duration,
    deadline: Instant,
    reply: RequestReply,
}

/// The state of a server actor.
pub struct ServerActorState {
    /// `server{id, era, pid}`: every event of this server, and its request tasks.
    span: tracing::Span,
    spec: ServerSpec,
    status: Arc<RwLock<ServerStatus>>,
    live: LiveSlot,
    state: ServerState,
    generation: u64,
    conn: Option<Arc<Connection>>,
    conn_actor: Option<ActorRef<ConnMsg>>,
    ready_at: Option<Instant>,
    restarts: RestartTracker,
    queue: VecDeque<Queued>,
    next_key: u64,
    last_error: Option<String>,
}

/// One supervised MCP server; see the module docs.
pub struct ServerActor;

impl Actor for ServerActor {
    type Msg = ServerMsg;
    type State = ServerActorState;
    type Arguments = ServerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ServerMsg>,
        args: ServerArgs,
    ) -> Result<ServerActorState, ActorProcessingErr> {
        let c = &args.spec.config;
        let restarts = RestartTracker::new(c.restart.clone(), c.max_retries);
        let span = tracing::info_span!("server", id = %args.spec.config.id, era = tracing::field::Empty, pid = tracing::field::Empty);
        let mut state = ServerActorState {
            span,
            spec: args.spec,
            status: args.status,
            live: args.live,
            state: ServerState::Starting,
            generation: 0,
            conn: None,
            conn_actor: None,
            ready_at: None,
            restarts,
            queue: VecDeque::new(),
            next_key: 0,
            last_error: None,
        };
        if !state.spec.config.enabled {
            // Listed, answering `Stopped`, until `restart_server` starts it.
            state.publish(ServerState::Stopped);
            return Ok(state);
        }
        state
            .span
            .in_scope(|| tracing::info!(server = %state.spec.config.id, "server starting"));
        state.publish(ServerState::Starting);
        start_connection(&myself, &mut state).await;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<ServerMsg>,
        msg: ServerMsg,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ServerMsg::Request {
                method,
                params,
                timeout,
                capabilities,
                reply,
            } => {
                let outgoing = Outgoing {
                    method,
                    params,
                    capabilities,
                };
                state.on_request(&myself, outgoing, timeout, reply).await
            }
            ServerMsg::Restart(reply) => {
                state.restarts.reset();
                if let Some(old) = state.conn_actor.take() {
                    let _ = old
                        .send_message(ConnMsg::Shutdown(ractor::concurrency::oneshot().0.into()));
                }
                state.conn = None;
                state.last_error = None;
                state.publish(ServerState::Starting);
                start_connection(&myself, state).await;
                let _ = reply.send(());
            }
            ServerMsg::Shutdown(reply) => {
                state.on_shutdown().await;
                let _ = reply.send(());
                myself.stop(None);
            }
            ServerMsg::ConnectionUp { generation, conn }
                if generation == state.generation && !conn.is_closed() =>
            {
                state.on_ready(&myself, conn).await
            }
            ServerMsg::ConnectionLost { generation, error }
                if generation == state.generation && state.conn.is_some() =>
            {
                if let Some(old) = state.conn_actor.take() {
                    old.kill();
                }
                state.on_connection_lost(&myself, error, ExitKind::Abnormal, false);
            }
            ServerMsg::Inbound { event, .. } => state.on_inbound(event),
            ServerMsg::StartConnection { generation } if generation == state.generation => {
                if state.state == ServerState::Restarting {
                    start_connection(&myself, state).await;
                }
            }
            ServerMsg::ExpireQueued(key) => state.on_expire(key),
            // Stale messages from an earlier connection attempt.
            ServerMsg::ConnectionUp { .. }
            | ServerMsg::ConnectionLost { .. }
            | ServerMsg::StartConnection { .. } => {}
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ServerMsg>,
        event: SupervisionEvent,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop this actor with its child.
        let (cell, reason, exit, fatal) = match &event {
            SupervisionEvent::ActorFailed(cell, err) => {
                let (exit, fatal) = classify(err.downcast_ref::<ConnectionFailure>());
                (cell, err.to_string(), exit, fatal)
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                reason.clone().unwrap_or_else(|| "connection ended".into()),
                ExitKind::Abnormal,
                false,
            ),
            _ => return Ok(()),
        };
        if state.is_current(cell) {
            state.conn_actor = None;
            state.on_connection_lost(&myself, reason, exit, fatal);
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ServerMsg>,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        state.on_shutdown().await;
        Ok(())
    }
}

/// Whether a connection's failure was a clean exit, and whether it can never succeed.
fn classify(failure: Option<&ConnectionFailure>) -> (ExitKind, bool) {
    match failure {
        Some(ConnectionFailure::Transport(TransportError::Closed { exit: Some(e) }))
            if e == "exit status: 0" =>
        {
            (ExitKind::Normal, false)
        }
        Some(ConnectionFailure::Connect(
            ConnectError::NoCommonVersion { .. }
            | ConnectError::NotModern(_)
            | ConnectError::UnsupportedLegacyVersion(_),
        )) => (ExitKind::Abnormal, true),
        _ => (ExitKind::Abnormal, false),
    }
}

async fn start_connection(myself: &ActorRef<ServerMsg>, state: &mut ServerActorState) {
    state.generation += 1;
    let args = ConnArgs {
        server: state.spec.config.id.clone(),
        spec: state.spec.config.transport.to_spec(),
        options: ConnectOptions {
            capabilities: state.spec.hooks.capabilities.read().clone(),
            ..state.spec.options.clone()
        },
        parent: myself.clone(),
        generation: state.generation,
    };
    match Actor::spawn_linked(None, ConnectionActor, args, myself.get_cell()).await {
        Ok((actor, _)) => state.conn_actor = Some(actor),
        Err(e) => state.on_connection_lost(
            myself,
            format!("could not start a connection actor: {e}"),
            ExitKind::Abnormal,
            false,
        ),
    }
}

impl ServerActorState {
    fn id(&self) -> &str {
        &self.spec.config.id
    }

    fn is_current(&self, cell: &ActorCell) -> bool {
        self.conn_actor
            .as_ref()
            .is_some_and(|a| a.get_id() == cell.get_id())
    }

    fn publish(&mut self, new: ServerState) {
        self.state = new;
        *self.live.write() = match (&self.conn, new) {
            (Some(conn), ServerState::Ready) => Some(LiveConnection {
                conn: conn.clone(),
                generation: self.generation,
            }),
            _ => None,
        };
        let mut s = self.status.write();
        s.state = new;
        s.last_error = self.last_error.clone();
        match &self.conn {
            Some(conn) => {
                s.era = Some(conn.era());
                s.protocol_version = Some(conn.protocol_version());
                s.pid = conn.pid();
                s.profile = Some(conn.profile().clone());
                s.ready_at = self.ready_at;
            }
            None => {
                s.pid = None;
                s.ready_at = None;
            }
        }
    }

    async fn on_request(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        outgoing: Outgoing,
        timeout: Option<Duration>,
        reply: RequestReply,
    ) {
        let timeout = timeout.unwrap_or(self.spec.config.timeout);
        let server = self.id().to_string();
        // A connection can end before this actor hears of it (its child's failure is
        // still in the mailbox): such a request waits for the restart like any other.
        let usable = self.conn.as_ref().filter(|c| !c.is_closed()).cloned();
        match (self.state, usable) {
            (ServerState::Ready, Some(conn)) => {
                dispatch(
                    myself,
                    &self.span,
                    conn,
                    self.generation,
                    outgoing,
                    timeout,
                    reply,
                )
                .await;
            }
            (ServerState::Ready | ServerState::Starting | ServerState::Restarting, _) => {
                if self.queue.len() >= self.spec.config.queue_capacity {
                    let _ = reply.send(Err(ServerError::Overloaded {
                        server,
                        capacity: self.spec.config.queue_capacity,
                    }));
                    return;
                }
                self.next_key += 1;
                let key = self.next_key;
                let deadline = Instant::now()
                    .checked_add(timeout)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
                self.queue.push_back(Queued {
                    key,
                    outgoing,
                    timeout,
                    deadline,
                    reply,
                });
                myself.send_after(timeout, move || ServerMsg::ExpireQueued(key));
            }
            (ServerState::Failed, _) => {
                let reason = self.last_error.clone().unwrap_or_default();
                let _ = reply.send(Err(ServerError::Failed { server, reason }));
            }
            (ServerState::Stopped, _) => {
                let _ = reply.send(Err(ServerError::Stopped { server }));
            }
        }
    }

    async fn on_ready(&mut self, myself: &ActorRef<ServerMsg>, conn: Arc<Connection>) {
        self.span.record("era", tracing::field::debug(conn.era()));
        if let Some(pid) = conn.pid() {
            self.span.record("pid", pid);
        }
        self.span.in_scope(|| {
            tracing::info!(server = %self.id(), era = ?conn.era(), version = %conn.protocol_version(), pid = ?conn.pid(), "server ready")
        });
        self.ready_at = Some(Instant::now());
        self.conn = Some(conn.clone());
        self.publish(ServerState::Ready);
        let now = Instant::now();
        for q in std::mem::take(&mut self.queue) {
            let remaining = q.deadline.saturating_duration_since(now);
            if remaining.is_zero() {
                let _ = q.reply.send(Err(self.restarting_error()));
            } else {
                dispatch(
                    myself,
                    &self.span,
                    conn.clone(),
                    self.generation,
                    q.outgoing,
                    remaining.min(q.timeout),
                    q.reply,
                )
                .await;
            }
        }
    }

    fn restarting_error(&self) -> ServerError {
        ServerError::Restarting {
            server: self.id().to_string(),
            reason: self.last_error.clone().unwrap_or_else(|| "starting".into()),
        }
    }

    fn on_expire(&mut self, key: u64) {
        if let Some(pos) = self.queue.iter().position(|q| q.key == key)
            && let Some(q) = self.queue.remove(pos)
        {
            let _ = q.reply.send(Err(self.restarting_error()));
        }
    }

    fn on_connection_lost(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        reason: String,
        exit: ExitKind,
        fatal: bool,
    ) {
        let up_since = self.ready_at.take();
        self.conn = None;
        self.last_error = Some(reason.clone());
        // Whatever that attempt still has in the mailbox (a ConnectionUp sent just before
        // it failed) is now stale.
        self.generation += 1;
        let decision = if fatal {
            Decision::GiveUp(reason.clone())
        } else {
            self.restarts.on_exit(Instant::now(), up_since, exit)
        };
        match decision {
            Decision::Restart(delay) => {
                self.span.in_scope(|| tracing::warn!(server = %self.id(), %reason, ?delay, "server connection ended; restarting after backoff"));
                self.status.write().restarts += 1;
                self.publish(ServerState::Restarting);
                let generation = self.generation;
                myself.send_after(delay, move || ServerMsg::StartConnection { generation });
            }
            Decision::GiveUp(why) => {
                self.span.in_scope(|| tracing::error!(server = %self.id(), reason = %why, "server failed; not restarting"));
                self.last_error = Some(if fatal {
                    why
                } else {
                    format!("{why}; last error: {reason}")
                });
                self.publish(ServerState::Failed);
                self.fail_queue();
            }
            Decision::Stop => {
                self.span.in_scope(|| tracing::info!(server = %self.id(), %reason, "server ended; its policy does not restart it"));
                self.publish(ServerState::Stopped);
                self.fail_queue();
            }
        }
    }

    fn fail_queue(&mut self) {
        let server = self.id().to_string();
        for q in std::mem::take(&mut self.queue) {
            let error = match self.state {
                ServerState::Failed => ServerError::Failed {
                    server: server.clone(),
                    reason: self.last_error.clone().unwrap_or_default(),
                },
                _ => ServerError::Stopped {
                    server: server.clone(),
                },
            };
            let _ = q.reply.send(Err(error));
        }
    }

    fn on_inbound(&mut self, event: ServerEvent) {
        match event {
            ServerEvent::Request(request) => self.on_server_request(request),
            ServerEvent::Notification(n) => {
                tracing::debug!(server = %self.id(), method = %n.method, "server notification");
                let lists_changed = matches!(
                    n.method.as_str(),
                    "notifications/tools/list_changed"
                        | "notifications/prompts/list_changed"
                        | "notifications/resources/list_changed"
                );
                if lists_changed && let Some(registry) = self.spec.hooks.registry.get() {
                    let _ = registry.send_message(RegistryMsg::Invalidate(self.id().to_string()));
                }
            }
            ServerEvent::Closed(_) => {}
        }
    }

    /// A legacy server asks the client something: the input handler of its method
    /// answers, in its own task (the handler may wait on a person).
    fn on_server_request(&mut self, request: ServerRequest) {
        let handler = self
            .spec
            .hooks
            .handlers
            .read()
            .get(&request.method)
            .cloned();
        let Some(handler) = handler else {
            tracing::debug!(server = %self.id(), method = %request.method, "no input handler for a server request");
            let message = format!("no handler for {} in this client", request.method);
            request.respond(Err(RpcError::new(METHOD_NOT_FOUND, message)));
            return;
        };
        let context = InputRequestContext {
            server: self.id().to_string(),
            method: request.method.clone(),
            params: request.params.clone(),
            agent_id: None,
            key: String::new(),
        };
        tokio::spawn(async move {
            let answer = handler
                .call(|port| InputMsg::Answer(context, port), None)
                .await;
            let outcome = match answer {
                Ok(CallResult::Success(Ok(value))) => Ok(value),
                Ok(CallResult::Success(Err(e))) => {
                    Err(RpcError::new(INTERNAL_ERROR, e.to_string()))
                }
                _ => Err(RpcError::new(
                    INTERNAL_ERROR,
                    "the input handler is unavailable",
                )),
            };
            request.respond(outcome);
        });
    }

    async fn on_shutdown(&mut self) {
        if self.state == ServerState::Stopped && self.conn_actor.is_none() {
            return;
        }
        self.last_error = None;
        self.conn = None;
        self.publish(ServerState::Stopped);
        self.fail_queue();
        if let Some(actor) = self.conn_actor.take() {
            // The connection's own graceful stop: stdin EOF, SIGTERM, SIGKILL, reap.
            let grace = self.spec.options.shutdown_grace;
            let limit = grace * 2 + Duration::from_secs(10);
            let _ = actor.call(ConnMsg::Shutdown, Some(limit)).await;
            actor.kill();
        }
        self.span
            .in_scope(|| tracing::info!(server = %self.id(), "server stopped"));
    }
}

/// Runs one request on the connection and answers through `reply`. The request is
/// polled once here, which writes it (stdio) or starts it (HTTP) in the order the actor
/// dispatches; the rest runs in its own task so the actor never waits on a server.
async fn dispatch(
    myself: &ActorRef<ServerMsg>,
    span: &tracing::Span,
    conn: Arc<Connection>,
    generation: u64,
    outgoing: Outgoing,
    timeout: Duration,
    reply: RequestReply,
) {
    let myself = myself.clone();
    let mut call = Box::pin(async move {
        let Outgoing {
            method,
            params,
            capabilities,
        } = outgoing;
        let live = LiveConnection { conn, generation };
        let result = run_request(
            &live,
            &myself,
            &method,
            params,
            timeout,
            capabilities.as_ref(),
        )
        .await;
        let _ = reply.send(result);
    });
    let done =
        std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx).is_ready())).await;
    if !done {
        tokio::spawn(tracing::Instrument::instrument(call, span.clone()));
    }
}

/// One request on a ready connection, with the server's id on its error. An HTTP server
/// that refuses the connection is reported to the server actor as down.
pub async fn run_request(
    live: &LiveConnection,
    actor: &ActorRef<ServerMsg>,
    method: &str,
    params: Option<Value>,
    timeout: Duration,
    capabilities: Option<&Value>,
) -> Result<Value, ServerError> {
    let conn = &live.conn;
    let result = conn
        .request_with(method, params, timeout, capabilities)
        .await;
    if conn.pid().is_none()
        && let Err(RequestError::Transport(TransportError::NotSent(e))) = &result
    {
        let lost = ServerMsg::ConnectionLost {
            generation: live.generation,
            error: e.clone(),
        };
        let _ = actor.send_message(lost);
    }
    result.map_err(|e| ServerError::from_request(conn.server(), e))
}
