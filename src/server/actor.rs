//! `ServerActor`: one per MCP server, with a stable address for its whole life. It
//! supervises the server's `ConnectionActor`, applies the restart policy when the
//! connection ends, holds requests while the server (re)starts, and publishes the
//! server's status, connection and offers through its [`ServerRef`] (their one writer).
//!
//! Requests never wait on the actor while the server is ready: [`ServerRef::request`]
//! runs them on the published connection. While the server starts or restarts,
//! requests wait in a bounded queue (released in order when it is ready, failed with
//! `Restarting` at their deadline, or refused with `Overloaded` past the bound). A
//! `failed` or `stopped` server answers at once.
//!
//! Failure: a stdio process exit reaches in-flight requests through the transport
//! (`TransportClosed`, at once) and this actor through its child's failure, typed
//! ([`ConnectionFailure`]). An HTTP server that refuses connections is treated as down
//! the same way. A connection that cannot work without a change of configuration (no
//! common version, a missing command, a refused certificate or credential) makes the
//! server `failed` at once, not after a backoff loop.
//!
//! Capabilities: when the input handlers change, a connected legacy server (which took
//! our capabilities at `initialize`) gets a new connection; the old one finishes the
//! requests it has in flight and is then shut down, so no call fails for it. A modern
//! server takes them with each request, and may list by them: its cached lists are
//! dropped and read again (also when it is not connected then).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::client::{ClientSide, ListsChanged};
use super::connection_actor::{ConnArgs, ConnMsg, ConnectionActor, ConnectionFailure};
use super::error::ServerError;
use super::msg::ServerMsg;
use super::queue::{Outgoing, RequestQueue, RequestReply};
use super::restart::{Decision, ExitKind};
use super::server_ref::{LiveConnection, Offers, ServerRef};
use super::status::ServerState;
use crate::transport::{
    ConnectOptions, Connection, Era, RequestOptions, ServerEvent, TransportError,
};

/// How long a server's `list_changed` notifications are gathered before they are passed
/// on, at first.
const LISTS_CHANGED_TICK: Duration = Duration::from_millis(100);

/// How long a rebuilt actor waits for its predecessor's process to be gone (killed
/// with that actor, it is reaped at once) before starting the next one beside it.
pub(super) const OLD_PROCESS_WAIT: Duration = Duration::from_secs(5);

/// Returns once every one of `processes` is gone.
pub(super) async fn all_gone(processes: Vec<crate::transport::ProcessExit>) {
    for process in processes {
        process.gone().await;
    }
}
/// The longest they are gathered: a server that keeps announcing changes (a storm, or
/// one after every listing it answers) doubles the gap up to this, so that it cannot
/// keep every process re-listing and every client notified ten times a second.
const LISTS_CHANGED_MAX_GAP: Duration = Duration::from_secs(30);
/// A server quiet this long after its changes were passed on starts again at the tick.
const LISTS_CHANGED_QUIET: Duration = Duration::from_secs(2);

/// What a server actor is started with (and rebuilt from).
#[derive(Clone)]
pub struct ServerArgs {
    pub(crate) server: ServerRef,
    pub(crate) client: Arc<dyn ClientSide>,
    pub(crate) options: ConnectOptions,
    /// Why the actor is started.
    pub(crate) start: Start,
}

/// Why a server actor is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// The server is new (added, or in the config at start).
    New,
    /// The server's actor died: a restart of the server, under its restart policy.
    ActorDied,
    /// The servers' supervisor died and every server actor with it: each is started
    /// again at once (one waiting out a restart's backoff waits out the rest of it),
    /// charged to no server's restart limit (the fault was the harness's own, and would
    /// otherwise count against every server at once).
    SupervisorRebuilt,
}

/// The connection attempt in charge.
struct Attempt {
    attempt: u64,
    actor: ActorRef<ConnMsg>,
    conn: Option<Arc<Connection>>,
    /// `subscriptions/listen` on this connection; ends with the attempt.
    listen: Option<super::listen::Listener>,
    /// A stdio server silent through a request's timeout and a probe is restarted.
    liveness: Option<super::liveness::Watch>,
    /// Ends a connect still under way (see [`ConnArgs::given_up`]).
    given_up: tokio_util::sync::CancellationToken,
    /// The client capabilities it declared (a legacy server holds them for the
    /// connection's life; a modern one's lists were read with them).
    capabilities: serde_json::Value,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // A connect under way is not waited for by whoever gave the attempt up.
        self.given_up.cancel();
    }
}

/// The state of a server actor.
pub struct ServerActorState {
    /// `server{id, era, pid}`: every event of this server, and its request tasks.
    span: tracing::Span,
    args: ServerArgs,
    state: ServerState,
    attempt: u64,
    current: Option<Attempt>,
    /// A new connection replacing the current one (capabilities changed).
    handover: Option<Attempt>,
    /// Handovers failed in a row: the next is tried after a backoff of its own.
    handovers_failed: u32,
    /// Replaced connections finishing what they have in flight, and their drains.
    draining: Vec<(ActorRef<ConnMsg>, tokio::task::AbortHandle)>,
    ready_at: Option<Instant>,
    /// When the restart waited for (backoff) starts its connection: a request whose
    /// deadline comes first is answered at once, free to go to another server.
    restart_at: Option<Instant>,
    /// Whether a connection of this server listened for changes before (a new one then
    /// reads its lists again: nothing is replayed). True in an actor that replaces a
    /// dead one: its connections did.
    listened: bool,
    /// Whether this server was connected before (in this actor or the one it replaces):
    /// a legacy server's lists are read again when it comes back, since what it
    /// announced while it was down was heard by nobody.
    connected_before: bool,
    queue: RequestQueue,
    last_error: Option<String>,
    lists_changed: ListsChanged,
    /// How long the changes now gathered wait (see [`LISTS_CHANGED_MAX_GAP`]).
    lists_gap: Duration,
    /// When changes were last passed on.
    lists_flushed: Option<Instant>,
    /// Whether it was asked to shut down ([`ServerMsg::Shutdown`]). An actor stopped
    /// otherwise (a fault, `stop` on its handle) stops its connections but leaves its
    /// server's state to the actor rebuilt in its place, which restarts it as after a
    /// crash, as when it is killed.
    stopping: bool,
    /// The server's processes still there are waited for, once, at most this long,
    /// before one is started beside them: those of the actor before (rebuilt: its
    /// predecessor, or their supervisor, died), or of the connection a restart stops.
    wait_for_old: Option<Duration>,
    /// Waiting for them: no connection is started (a restart asked meanwhile starts
    /// once they are gone, with the wait's `PredecessorStopped`).
    waiting_for_old: bool,
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
        let config = args.server.config();
        let queue = RequestQueue::new(config.queue_capacity);
        // Log context for as long as the server is supervised, not exported as a trace (see
        // `CONNECTION_SPANS`); what happens to the connection is its own short span.
        let span = tracing::info_span!(target: crate::util::trace_context::CONNECTION_SPANS, "server", id = %config.id, era = tracing::field::Empty, pid = tracing::field::Empty);
        let (enabled, start) = (config.enabled, args.start);
        // What the server was when the actor before this one died.
        let before = (start != Start::New).then(|| {
            let mut s = args.server.0.status.write();
            s.actor_rebuilds += 1;
            (s.state, s.ready_at, s.last_error.clone())
        });
        // Connected before, in an actor before this one (a rebuild, or a start by
        // `restart_server` after a rebuild that failed): its lists are read again.
        let connected_before = start != Start::New || args.server.0.status.read().profile.is_some();
        let mut state = ServerActorState {
            span,
            args,
            state: ServerState::Starting,
            attempt: 0,
            current: None,
            handover: None,
            handovers_failed: 0,
            draining: Vec::new(),
            ready_at: None,
            restart_at: None,
            listened: connected_before,
            connected_before,
            queue,
            last_error: None,
            lists_changed: ListsChanged::default(),
            lists_gap: LISTS_CHANGED_TICK,
            lists_flushed: None,
            stopping: false,
            wait_for_old: (start != Start::New).then_some(OLD_PROCESS_WAIT),
            waiting_for_old: false,
        };
        match (start, before) {
            (Start::New, _) if !enabled => {
                // Listed, answering `Stopped`, until `restart_server` starts it.
                state.publish(ServerState::Stopped);
                return Ok(state);
            }
            // A failed or stopped server (disabled ones too) stays so: it had no
            // connection to lose. `restart_server` brings it back.
            (_, Some((was @ (ServerState::Failed | ServerState::Stopped), _, last_error))) => {
                state.last_error = last_error;
                state.publish(was);
                return Ok(state);
            }
            // It died waiting out a restart's backoff, with no connection to lose (one
            // being made afterwards, still `restarting`, died with it: charged below),
            // or its supervisor did: the new actor waits out the rest of it, and the
            // restart is charged once (a supervisor that kept dying would otherwise
            // start a crash-looping server again at once, each time).
            (
                Start::ActorDied | Start::SupervisorRebuilt,
                Some((ServerState::Restarting, _, last_error)),
            ) if state.args.server.0.restarts.lock().due().is_some() => {
                let due = state.args.server.0.restarts.lock().due();
                let now = Instant::now();
                let left = due.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
                state.last_error = last_error;
                state.publish(ServerState::Restarting);
                state.restart_at = Some(crate::util::duration::after(now, left));
                let attempt = state.attempt;
                myself.send_after(left, move || ServerMsg::StartConnection { attempt });
                return Ok(state);
            }
            // The dead actor took its connection with it: a restart, held to the
            // server's policy, backoff and limit like a crash (else an actor that kept
            // dying would start its server again at once, for ever).
            (Start::ActorDied, Some((was, ready_at, _))) => {
                let up_since = ready_at.filter(|_| was == ServerState::Ready);
                let decision = state.args.server.0.restarts.lock().on_exit(
                    Instant::now(),
                    up_since,
                    ExitKind::Abnormal,
                );
                let reason = "the server's actor died (its connection with it)";
                state.last_error = Some(reason.to_string());
                state.follow(&myself, decision, reason, false);
                return Ok(state);
            }
            _ => {}
        }
        state
            .span
            .in_scope(|| tracing::info!(server = %state.id(), "server starting"));
        state.publish(ServerState::Starting);
        state.start_connection(&myself).await;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<ServerMsg>,
        msg: ServerMsg,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            #[cfg(test)]
            ServerMsg::Panic => panic!("a bug in the server actor (injected by a test)"),
            ServerMsg::Request { outgoing, reply } => {
                state.on_request(&myself, outgoing, reply).await
            }
            ServerMsg::Restart(reply) => {
                state.on_restart(&myself).await;
                let _ = reply.send(());
            }
            ServerMsg::Shutdown(reply) => {
                state.stopping = true;
                state.on_shutdown().await;
                let _ = reply.send(());
                myself.stop(None);
            }
            ServerMsg::CapabilitiesChanged => state.on_capabilities_changed(&myself, true).await,
            ServerMsg::RetryHandover => state.on_capabilities_changed(&myself, false).await,
            ServerMsg::ConnectionUp { attempt, conn } => {
                state.on_connection_up(&myself, attempt, conn).await;
                // Capabilities that changed while it connected (a handler registered
                // during a handshake, or two in a row) are caught up with now.
                state.on_capabilities_changed(&myself, false).await;
            }
            ServerMsg::ConnectionLost { attempt, error } => {
                if state.current_attempt() == Some(attempt) && state.state == ServerState::Ready {
                    // Left in place for `on_connection_lost` to read its version.
                    if let Some(old) = &state.current {
                        old.actor.kill();
                    }
                    let failure = ConnectionFailure::Transport(error);
                    state.on_connection_lost(&myself, &failure);
                }
            }
            ServerMsg::Inbound { event, queued, .. } => {
                state.on_inbound(&myself, event);
                // Only once its list is marked may another change of it come.
                drop(queued);
            }
            ServerMsg::StartConnection { attempt } => {
                if attempt == state.attempt && state.state == ServerState::Restarting {
                    state.start_connection(&myself).await;
                }
            }
            ServerMsg::PredecessorStopped => {
                state.waiting_for_old = false;
                // Unless a connection was started meanwhile (a restart asked for, an
                // earlier wait's message), or a backoff's timer starts it.
                let waiting = state.current.is_none()
                    && state.restart_at.is_none()
                    && !state.stopping
                    && matches!(state.state, ServerState::Starting | ServerState::Restarting);
                if waiting {
                    state.start_connection(&myself).await;
                }
            }
            ServerMsg::ExpireQueued(key) => {
                if let Some(q) = state.queue.expire(key) {
                    let _ = q.reply.send(Err(state.restarting_error()));
                }
            }
            ServerMsg::FlushListsChanged => {
                let changed = std::mem::take(&mut state.lists_changed);
                if changed.any() {
                    state.lists_flushed = Some(Instant::now());
                    state.args.client.lists_changed(state.id(), changed);
                }
            }
        }
        state.note_queued();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ServerMsg>,
        event: SupervisionEvent,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop this actor with its child.
        let (cell, failure) = match &event {
            SupervisionEvent::ActorFailed(cell, err) => {
                let failure = match err.downcast_ref::<ConnectionFailure>() {
                    Some(ConnectionFailure::Connect(e)) => ConnectionFailure::Connect(e.clone()),
                    Some(ConnectionFailure::Transport(e)) => {
                        ConnectionFailure::Transport(e.clone())
                    }
                    None => ConnectionFailure::Transport(TransportError::Closed {
                        exit: None,
                        detail: Some(err.to_string()),
                    }),
                };
                (cell, failure)
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                ConnectionFailure::Transport(TransportError::Closed {
                    exit: None,
                    detail: Some(reason.clone().unwrap_or_else(|| "connection ended".into())),
                }),
            ),
            _ => return Ok(()),
        };
        if is_attempt(&state.handover, cell) {
            // The replacement failed: keep serving on the current connection, and try
            // again later.
            state.handover = None;
            state.span.in_scope(|| tracing::warn!(server = %state.id(), error = %failure, "reconnecting with new capabilities failed; keeping the current connection"));
            state.retry_handover(&myself);
        } else if is_attempt(&state.current, cell) {
            state.on_connection_lost(&myself, &failure);
        }
        // Giving up on the server answers its queue.
        state.note_queued();
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ServerMsg>,
        state: &mut ServerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match state.stopping {
            true => state.on_shutdown().await,
            false => state.stop_connections().await,
        }
        Ok(())
    }
}

fn is_attempt(attempt: &Option<Attempt>, cell: &ActorCell) -> bool {
    attempt
        .as_ref()
        .is_some_and(|a| a.actor.get_id() == cell.get_id())
}

impl ServerActorState {
    /// A short span of its own for one thing that happened to the connection (`restart`,
    /// `failed`, `stopped`), so that it reaches a trace backend as it happens rather than
    /// as an event of a span that lasts as long as the server.
    fn lifecycle_span(&self, what: &str) -> tracing::Span {
        tracing::info_span!(
            parent: &self.span,
            "connection",
            otel.name = %format!("{what} {}", self.id()),
            mcp_harness.server.id = %self.id(),
        )
    }

    fn id(&self) -> &str {
        self.args.server.id()
    }

    fn current_attempt(&self) -> Option<u64> {
        self.current.as_ref().map(|a| a.attempt)
    }

    fn current_conn(&self) -> Option<&Arc<Connection>> {
        self.current.as_ref().and_then(|a| a.conn.as_ref())
    }

    /// Writes the server's state, connection and status (the one writer of them).
    /// Publishes the queue's depth, after whatever may have changed it.
    fn note_queued(&self) {
        let depth = self.queue.len();
        if self.args.server.0.status.read().queued != depth {
            self.args.server.0.status.write().queued = depth;
        }
    }

    fn publish(&mut self, new: ServerState) {
        self.state = new;
        let shared = &self.args.server.0;
        let conn = self.current_conn().cloned();
        *shared.live.write() = match (&conn, new) {
            (Some(conn), ServerState::Ready) => Some(LiveConnection {
                conn: conn.clone(),
                attempt: self.current_attempt().unwrap_or_default(),
            }),
            _ => None,
        };
        if let Some(conn) = &conn {
            *shared.offers.write() = Some(Offers::of(conn.profile().capabilities()));
        }
        let mut s = shared.status.write();
        s.state = new;
        s.last_error = self.last_error.clone();
        // A rebuilt actor's queue starts empty, whatever the dead one's held.
        s.queued = self.queue.len();
        match &conn {
            Some(conn) => {
                s.era = Some(conn.era());
                s.protocol_version = Some(conn.protocol_version());
                s.pid = conn.pid();
                s.profile = Some(Arc::new(conn.profile().clone()));
                s.ready_at = self.ready_at;
            }
            None => {
                s.pid = None;
                s.ready_at = None;
            }
        }
    }

    async fn spawn_attempt(&mut self, myself: &ActorRef<ServerMsg>) -> Result<Attempt, String> {
        self.attempt = 1 + self
            .args
            .server
            .0
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let config = self.args.server.config();
        // Progress goes straight from the transport's reader to the call that asked, in
        // order with its result (the mailbox would let the result overtake it).
        let client = self.args.client.clone();
        let id = config.id.clone();
        let progress = crate::transport::ProgressHook(std::sync::Arc::new(move |params| {
            client.progress(&id, params)
        }));
        let given_up = tokio_util::sync::CancellationToken::new();
        let capabilities = self.args.client.capabilities();
        let args = ConnArgs {
            server: config.id.clone(),
            spec: config.transport.clone(),
            options: ConnectOptions {
                capabilities: capabilities.clone(),
                era: config.era,
                request_timeout: config.timeout,
                progress: Some(progress),
                spawned: Some(self.args.server.spawn_hook()),
                ..self.args.options.clone()
            },
            allow_unsolicited_input: config.allow_unsolicited_input,
            parent: myself.clone(),
            attempt: self.attempt,
            given_up: given_up.clone(),
        };
        match Actor::spawn_linked(None, ConnectionActor, args, myself.get_cell()).await {
            Ok((actor, _)) => Ok(Attempt {
                attempt: self.attempt,
                actor,
                conn: None,
                listen: None,
                liveness: None,
                given_up,
                capabilities,
            }),
            Err(e) => Err(format!("could not start a connection actor: {e}")),
        }
    }

    async fn start_connection(&mut self, myself: &ActorRef<ServerMsg>) {
        // Due now (a restart's backoff waited out): `PredecessorStopped` starts it.
        self.restart_at = None;
        if let Some(stopping) = self.args.server.predecessor_stopping() {
            // Requests wait in the queue meanwhile, as during a restart.
            let myself = myself.clone();
            tokio::spawn(async move {
                stopping.cancelled().await;
                let _ = myself.send_message(ServerMsg::PredecessorStopped);
            });
            return;
        }
        // The dead actor's process is killed with it, but the kill is a message each
        // actor handles in its own time: two of one server (a port, a lock file) could
        // otherwise run at once.
        if self.waiting_for_old {
            return;
        }
        let (old, wait) = match self.wait_for_old.take() {
            Some(wait) => (self.args.server.live_processes(), wait),
            None => (Vec::new(), Duration::ZERO),
        };
        if !old.is_empty() {
            self.waiting_for_old = true;
            let (myself, server) = (myself.clone(), self.id().to_string());
            tokio::spawn(async move {
                if tokio::time::timeout(wait, all_gone(old)).await.is_err() {
                    tracing::warn!(
                        server,
                        ?wait,
                        "the server's earlier process is still there; starting the next one beside it"
                    );
                }
                let _ = myself.send_message(ServerMsg::PredecessorStopped);
            });
            return;
        }
        self.args.server.0.restarts.lock().connecting();
        match self.spawn_attempt(myself).await {
            Ok(attempt) => self.current = Some(attempt),
            Err(reason) => {
                let failure = ConnectionFailure::Transport(TransportError::NotSent(reason));
                self.on_connection_lost(myself, &failure);
            }
        }
    }

    async fn on_restart(&mut self, myself: &ActorRef<ServerMsg>) {
        self.args.server.0.restarts.lock().reset();
        for old in [self.current.take(), self.handover.take()]
            .into_iter()
            .flatten()
        {
            self.stop_replaced(old);
        }
        self.last_error = None;
        self.ready_at = None;
        self.publish(ServerState::Starting);
        // The old connection stops gracefully (its requests drained, stdin EOF, SIGTERM,
        // SIGKILL): the new process starts once it is gone, not beside it (a port, a
        // lock file).
        self.wait_for_old = Some(self.stop_limit());
        self.start_connection(myself).await;
    }

    async fn on_request(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        outgoing: Outgoing,
        reply: RequestReply,
    ) {
        let server = self.id().to_string();
        // A connection can end before this actor hears of it (its child's failure is
        // still in the mailbox): such a request waits for the restart like any other.
        let usable = self.current_conn().filter(|c| !c.is_closed()).cloned();
        match (self.state, usable) {
            (ServerState::Ready, Some(conn)) => {
                // It came through the mailbox while the server was not ready: it may
                // have waited behind the message that made it so.
                if outgoing
                    .still_wanted
                    .as_ref()
                    .is_some_and(|wanted| !wanted())
                {
                    let _ = reply.send(Err(ServerError::Withdrawn { server }));
                    return;
                }
                let attempt = self.current_attempt().unwrap_or_default();
                self.send_on(LiveConnection { conn, attempt }, outgoing, reply)
                    .await;
            }
            (ServerState::Restarting, _)
                if self.restart_at.is_some_and(|at| at >= outgoing.deadline) =>
            {
                // It would only wait out its deadline in the queue.
                let _ = reply.send(Err(self.restarting_error()));
            }
            (ServerState::Ready | ServerState::Starting | ServerState::Restarting, _) => {
                let left = outgoing.left();
                let arm = |key| {
                    let timer = myself.send_after(left, move || ServerMsg::ExpireQueued(key));
                    Some(crate::util::AbortOnDrop(timer.abort_handle()))
                };
                match self.queue.push(outgoing, reply, arm) {
                    Ok(_) => {}
                    Err(reply) => {
                        let _ = reply.send(Err(ServerError::Overloaded {
                            server,
                            capacity: self.queue.capacity(),
                        }));
                    }
                }
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

    /// Runs one request on the connection and answers through `reply`. The request is
    /// polled once here, which writes it (stdio) or starts it (HTTP) in the order the
    /// actor releases them; the rest runs in its own task so the actor never waits on
    /// a server. A request whose caller has gone (its call cancelled while it waited
    /// here) is not sent, and one whose caller goes while it runs is dropped, which
    /// cancels it on the server: run for nobody, it could only be unnoted, and a legacy
    /// server's questions during it would be taken for another call's.
    async fn send_on(&self, live: LiveConnection, outgoing: Outgoing, reply: RequestReply) {
        if reply.is_closed() {
            return;
        }
        // Its time ran out on the way here: not sent (it would run for nobody).
        if outgoing.left().is_zero() {
            let _ = reply.send(Err(ServerError::Transport {
                server: self.id().to_string(),
                source: TransportError::Timeout(Duration::ZERO),
            }));
            return;
        }
        // From here the request may reach the server: lost unanswered, it must not
        // read as `Unavailable` (never sent, free to go to another server).
        let mut reply = SentReply {
            reply: Some(reply),
            server: self.id().to_string(),
        };
        let server = self.args.server.clone();
        let mut call = Box::pin(async move {
            let timeout = outgoing.left();
            let Outgoing {
                method,
                params,
                capabilities,
                identity,
                owner,
                deadline: _,
                still_wanted: _,
            } = outgoing;
            let options = RequestOptions {
                capabilities: capabilities.as_ref(),
                identity: identity.as_deref(),
                owner,
            };
            server
                .on_connection(&live, &method, params.as_ref(), timeout, options)
                .await
        });
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))
        })
        .await;
        if let std::task::Poll::Ready(result) = first {
            reply.send(result);
            return;
        }
        let rest = async move {
            tokio::select! {
                result = call => reply.send(result),
                () = reply.closed() => {}
            }
        };
        tokio::spawn(tracing::Instrument::instrument(rest, self.span.clone()));
    }

    /// Starts listening for list changes on a new connection (modern servers that
    /// announce them).
    /// Its notifications go to `myself`: the server's published address may still be
    /// the actor's before it (a rebuild publishes the new one once it is spawned).
    fn listen(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        attempt: u64,
        conn: &Arc<Connection>,
    ) -> Option<super::listen::Listener> {
        let listener = super::listen::start(myself.clone(), attempt, conn.clone(), self.listened)?;
        self.listened = true;
        Some(listener)
    }

    async fn on_connection_up(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        attempt: u64,
        conn: Arc<Connection>,
    ) {
        if conn.is_closed() {
            return;
        }
        if let Some(mut handover) = self.handover.take_if(|h| h.attempt == attempt) {
            // The replacement is up: switch, and let the old connection drain.
            handover.listen = self.listen(myself, attempt, &conn);
            handover.liveness =
                super::liveness::watch(self.id(), &conn, self.args.server.config().timeout);
            handover.conn = Some(conn.clone());
            let old = self.current.replace(handover);
            self.span.in_scope(|| tracing::info!(server = %self.id(), "reconnected with the new client capabilities"));
            self.handovers_failed = 0;
            // A new process: its uptime counts from now. The old one's, if it was long
            // enough, forgives earlier restarts as its healthy exit would have.
            let now = Instant::now();
            (self.args.server.0.restarts.lock()).forgive_if_healthy(now, self.ready_at);
            self.ready_at = Some(now);
            self.record_connection(&conn);
            // Published before the old one drains: a request that reads the old one
            // after its drain found it idle would meet it shut.
            self.publish(ServerState::Ready);
            if let Some(mut old) = old {
                old.listen = None;
                self.draining.retain(|(_, drain)| !drain.is_finished());
                let limit = self.args.server.config().timeout;
                self.draining
                    .push(drain_and_stop(old, limit, self.stop_limit()));
            }
            // What it lists may depend on what we declared (many legacy servers list
            // elicitation tools only to clients that can answer them).
            self.args.client.lists_changed(self.id(), ListsChanged::ALL);
            // Requests that found the old connection closed before its failure reached
            // this actor were queued; that failure is now stale and restarts nothing.
            self.send_queued(LiveConnection { conn, attempt }).await;
            return;
        }
        let Some(current) = self.current.as_mut().filter(|c| c.attempt == attempt) else {
            return; // a stale attempt
        };
        current.conn = Some(conn.clone());
        let listen = self.listen(myself, attempt, &conn);
        let liveness = super::liveness::watch(self.id(), &conn, self.args.server.config().timeout);
        if let Some(current) = self.current.as_mut() {
            current.listen = listen;
            current.liveness = liveness;
        }
        self.record_connection(&conn);
        self.span.in_scope(|| {
            tracing::info!(server = %self.id(), era = conn.era().as_str(), version = %conn.protocol_version(), pid = ?conn.pid(), "server ready")
        });
        self.ready_at = Some(Instant::now());
        let version_before = self.args.server.0.status.read().protocol_version.clone();
        // A modern server's new subscription reads them again (`listen`), unless it came
        // back speaking another version: what it listed before is of another shape.
        // Dropped before the server is published ready: a listing in between would be
        // served the old shape.
        let other_version = version_before.is_some_and(|v| !conn.protocol_version_is(&v));
        if std::mem::replace(&mut self.connected_before, true)
            && (conn.era() == Era::Legacy || other_version)
        {
            self.args.client.lists_changed(self.id(), ListsChanged::ALL);
        }
        self.publish(ServerState::Ready);
        self.send_queued(LiveConnection { conn, attempt }).await;
    }

    /// Sends what waited in the queue on `live`, but for what ran out of time or was
    /// withdrawn meanwhile.
    async fn send_queued(&mut self, live: LiveConnection) {
        for q in self.queue.drain() {
            if q.outgoing.left().is_zero() {
                let _ = q.reply.send(Err(self.restarting_error()));
            } else if q
                .outgoing
                .still_wanted
                .as_ref()
                .is_some_and(|wanted| !wanted())
            {
                let _ = q.reply.send(Err(ServerError::Withdrawn {
                    server: self.id().to_string(),
                }));
            } else {
                self.send_on(live.clone(), q.outgoing, q.reply).await;
            }
        }
    }

    fn record_connection(&self, conn: &Connection) {
        self.span.record("era", conn.era().as_str());
        if let Some(pid) = conn.pid() {
            self.span.record("pid", pid);
        }
    }

    /// The client's capabilities changed (`told`: a handler was registered), or may
    /// have while a connection was made.
    async fn on_capabilities_changed(&mut self, myself: &ActorRef<ServerMsg>, told: bool) {
        let all = ListsChanged::ALL;
        let era = self.current_conn().map(|c| c.era());
        if self.state != ServerState::Ready || era.is_none() {
            // Not connected (starting, restarting, failed, stopped): the next connection
            // declares them, but what was listed under the old ones may be cached (a
            // modern server is not listed again when it comes back): dropped now.
            if told {
                self.args.client.lists_changed(self.id(), all);
            }
            return;
        }
        if self.handover.is_some() {
            // A handover under way is compared with them once it is up.
            return;
        }
        let now = self.args.client.capabilities();
        let Some(current) = self.current.as_mut() else {
            return;
        };
        if current.capabilities == now {
            // Caught up (a retry not needed any more): the next change starts afresh.
            self.handovers_failed = 0;
            return;
        }
        if era == Some(Era::Modern) {
            // A modern server takes capabilities with each request, and may list by
            // them: what it listed under the old ones is dropped and read again.
            current.capabilities = now;
            self.args.client.lists_changed(self.id(), all);
            return;
        }
        self.span.in_scope(|| tracing::info!(server = %self.id(), "client capabilities changed; reconnecting this legacy server"));
        match self.spawn_attempt(myself).await {
            Ok(attempt) => self.handover = Some(attempt),
            Err(reason) => {
                self.span.in_scope(|| tracing::warn!(server = %self.id(), %reason, "could not reconnect with new capabilities"));
                self.retry_handover(myself);
            }
        }
    }

    /// A handover failed: tried again after a backoff (1 s, doubling to a minute), so
    /// that a legacy server is not left declared what the client no longer is (asking
    /// what no handler answers, or hiding what it lists only to clients that answer).
    fn retry_handover(&mut self, myself: &ActorRef<ServerMsg>) {
        let failed = self.handovers_failed.min(6);
        self.handovers_failed = self.handovers_failed.saturating_add(1);
        let delay = Duration::from_secs(1 << failed).min(Duration::from_secs(60));
        myself.send_after(delay, || ServerMsg::RetryHandover);
    }

    fn restarting_error(&self) -> ServerError {
        ServerError::Restarting {
            server: self.id().to_string(),
            reason: self.last_error.clone().unwrap_or_else(|| "starting".into()),
        }
    }

    fn stop_limit(&self) -> Duration {
        stop_limit(self.args.options.shutdown_grace)
    }

    /// Stops a connection given up for another at once, kept among the draining ones:
    /// a removal or shutdown right after waits for its process (it was told to stop and
    /// forgotten, and outlived them).
    fn stop_replaced(&mut self, mut old: Attempt) {
        old.listen = None;
        old.given_up.cancel();
        self.draining.retain(|(_, drain)| !drain.is_finished());
        self.draining
            .push(drain_and_stop(old, Duration::ZERO, self.stop_limit()));
    }

    fn on_connection_lost(&mut self, myself: &ActorRef<ServerMsg>, failure: &ConnectionFailure) {
        let (exit, cannot_heal) = failure.classify();
        let reason = failure.to_string();
        let up_since = self.ready_at.take();
        // The version it spoke last (renegotiated since it was published, perhaps): what
        // the next connection is compared with, and a restarting server's disk lookups.
        if let Some(conn) = self.current_conn() {
            let version = conn.protocol_version();
            self.args.server.0.status.write().protocol_version = Some(version);
        }
        self.current = None;
        // A handover under way was to replace the connection now lost: the restart
        // below starts afresh, with the capabilities of the moment (the handover, up,
        // would have been taken for a ready server with its queue left waiting).
        if let Some(handover) = self.handover.take() {
            self.stop_replaced(handover);
        }
        self.last_error = Some(reason.clone());
        // Whatever that attempt still has in the mailbox is now stale.
        self.attempt += 1;
        let decision = if cannot_heal {
            Decision::GiveUp(reason.clone())
        } else {
            self.args
                .server
                .0
                .restarts
                .lock()
                .on_exit(Instant::now(), up_since, exit)
        };
        self.follow(myself, decision, &reason, cannot_heal);
    }

    /// Carries out what the restart policy decided after the connection ended
    /// (`reason`).
    fn follow(
        &mut self,
        myself: &ActorRef<ServerMsg>,
        decision: Decision,
        reason: &str,
        cannot_heal: bool,
    ) {
        match decision {
            Decision::Restart(delay) => {
                self.lifecycle_span("restart").in_scope(|| tracing::warn!(server = %self.id(), %reason, ?delay, "server connection ended; restarting after backoff"));
                self.args.server.0.status.write().restarts += 1;
                self.publish(ServerState::Restarting);
                let attempt = self.attempt;
                let at = crate::util::duration::after(Instant::now(), delay);
                self.restart_at = Some(at);
                myself.send_after(delay, move || ServerMsg::StartConnection { attempt });
                // Those that cannot be served in time are answered now (another server
                // may serve them).
                for q in self.queue.due_by(at) {
                    let _ = q.reply.send(Err(self.restarting_error()));
                }
            }
            Decision::GiveUp(why) => {
                self.lifecycle_span("failed").in_scope(|| tracing::error!(server = %self.id(), reason = %why, "server failed; not restarting"));
                self.last_error = Some(if cannot_heal {
                    why
                } else {
                    format!("{why}; last error: {reason}")
                });
                self.publish(ServerState::Failed);
                self.fail_queue();
            }
            Decision::Stop => {
                self.lifecycle_span("stopped").in_scope(|| tracing::info!(server = %self.id(), %reason, "server ended; its policy does not restart it"));
                self.publish(ServerState::Stopped);
                self.fail_queue();
            }
        }
    }

    fn fail_queue(&mut self) {
        let server = self.id().to_string();
        for q in self.queue.drain() {
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

    fn on_inbound(&mut self, myself: &ActorRef<ServerMsg>, event: ServerEvent) {
        match event {
            ServerEvent::Request(request) => {
                let id = self.id().to_string();
                self.args.client.answer(&id, request);
            }
            ServerEvent::Notification(n) => {
                tracing::debug!(server = %self.id(), method = %crate::util::text::one_line(&n.method, 100), "server notification");
                let first = !self.lists_changed.any();
                if self.lists_changed.mark(&n.method) && first {
                    // A flood of notifications becomes one invalidation per gap, and
                    // changes that keep coming widen the gap.
                    self.lists_gap = match self.lists_flushed {
                        Some(at) if at.elapsed() < LISTS_CHANGED_QUIET => {
                            (self.lists_gap * 2).min(LISTS_CHANGED_MAX_GAP)
                        }
                        _ => LISTS_CHANGED_TICK,
                    };
                    myself.send_after(self.lists_gap, || ServerMsg::FlushListsChanged);
                }
            }
            ServerEvent::Closed(_) => {}
        }
    }

    async fn on_shutdown(&mut self) {
        // A finished drain has stopped its connection (one that died early has not, and
        // is stopped with the rest; asking a stopped actor costs nothing).
        if self.state == ServerState::Stopped
            && self.current.is_none()
            && self.handover.is_none()
            && self.draining.iter().all(|(_, drain)| drain.is_finished())
        {
            return;
        }
        self.last_error = None;
        let attempts = self.take_attempts();
        self.publish(ServerState::Stopped);
        self.fail_queue();
        self.note_queued();
        self.stop_all(attempts).await;
        self.span
            .in_scope(|| tracing::info!(server = %self.id(), "server stopped"));
    }

    /// Stops every connection this actor holds, saying nothing of the server's state
    /// (but no request goes to a connection being stopped: they go to the actor, and
    /// wait for the one rebuilt or fail over).
    async fn stop_connections(&mut self) {
        *self.args.server.0.live.write() = None;
        let attempts = self.take_attempts();
        self.stop_all(attempts).await;
    }

    fn take_attempts(&mut self) -> Vec<Attempt> {
        [self.current.take(), self.handover.take()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Stops `attempts` and the replaced connections still draining.
    async fn stop_all(&mut self, attempts: Vec<Attempt>) {
        let draining = std::mem::take(&mut self.draining);
        // A replaced connection stops now too, not when this actor's children are torn
        // down after it (killed, after `shutdown()` returned).
        let mut actors = Vec::new();
        for (actor, drain) in draining {
            drain.abort();
            actors.push(actor);
        }
        for attempt in &attempts {
            // A connect under way ends now.
            attempt.given_up.cancel();
            actors.push(attempt.actor.clone());
        }
        // A live connection stops gracefully (stdin EOF, SIGTERM, SIGKILL, reap), all at
        // once: each may take its grace twice.
        let limit = self.stop_limit();
        let stops = actors.iter().map(|actor| async move {
            let _ = actor.call(ConnMsg::Shutdown, Some(limit)).await;
            actor.kill();
        });
        futures_util::future::join_all(stops).await;
        drop(attempts);
    }
}

/// How long a connection's graceful stop may take: a live one may take its grace
/// twice (stdin EOF, then SIGTERM), and its reap a while.
pub(super) fn stop_limit(grace: Duration) -> Duration {
    grace
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(10))
}

/// How long a replaced connection is kept before its drain first looks for requests
/// in flight on it.
const DRAIN_SETTLE: Duration = Duration::from_millis(500);

/// Lets a replaced connection finish what it has in flight (up to `limit`), then stops
/// it gracefully; its actor, and the drain's handle for a shutdown that cannot wait.
fn drain_and_stop(
    old: Attempt,
    limit: Duration,
    stop_limit: Duration,
) -> (ActorRef<ConnMsg>, tokio::task::AbortHandle) {
    let actor = old.actor.clone();
    let drain = tokio::spawn(async move {
        let started = Instant::now();
        if let Some(conn) = &old.conn {
            // A request that read the old connection just before the new one was
            // published counts itself in flight a moment later.
            tokio::time::sleep(DRAIN_SETTLE.min(limit)).await;
            while conn.in_flight() > 0 && started.elapsed() < limit {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let _ = old.actor.call(ConnMsg::Shutdown, Some(stop_limit)).await;
        old.actor.kill();
    });
    (actor, drain.abort_handle())
}

/// The reply to a request that may have reached its server. Dropped unanswered (its
/// task panicked, or was dropped with the runtime), it answers that the transport lost
/// the request: the caller's closed channel alone would read as `Unavailable`, which
/// lets the request go to another server.
struct SentReply {
    reply: Option<RequestReply>,
    server: String,
}

impl SentReply {
    fn send(&mut self, result: Result<serde_json::Value, ServerError>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(result);
        }
    }

    /// Ready when the caller has gone.
    async fn closed(&mut self) {
        match self.reply.as_mut() {
            Some(reply) => reply.closed().await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for SentReply {
    fn drop(&mut self) {
        let server = std::mem::take(&mut self.server);
        self.send(Err(ServerError::TransportClosed {
            server,
            source: TransportError::Closed {
                exit: None,
                detail: Some("the request's task ended without its answer".into()),
            },
        }));
    }
}
