//! `ConnectionActor`: the live connection of one server (a stdio child process or an
//! HTTP client), owned by an actor that fails when the transport breaks.
//!
//! Lifecycle: spawned by its `ServerActor` (one per connection attempt, tagged with a
//! attempt); connects in `post_start` (spawn, probe, handshake) and reports
//! `ServerMsg::ConnectionUp`, or fails with the [`ConnectionFailure`]. It forwards the
//! server's own traffic (legacy requests, notifications) to its parent and fails when the
//! transport reports its end, which is how the parent learns of a crash.
//!
//! Guarantees: a graceful stop shuts the connection down (stdin EOF, SIGTERM, SIGKILL,
//! reap); a kill, or a failure, drops the state, whose [`KillOnDrop`] SIGKILLs the
//! process group synchronously: no path leaves the process behind.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::client::ListsChanged;
use super::msg::{OnTheWay, Queued, ServerMsg};
use super::restart::ExitKind;
use crate::transport::{
    ConnectError, ConnectOptions, Connection, ServerEvent, TransportError, TransportSpec,
};

/// Why a connection actor failed; its parent reads it to choose restart or failure.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionFailure {
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The transport ended after the connection was up.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Messages of a connection actor.
pub enum ConnMsg {
    /// Traffic from the server (forwarded up) or the transport's end (fails the actor),
    /// with a `list_changed`'s place on its way.
    Event(ServerEvent, Option<Queued>),
    /// Shut the connection down gracefully, then stop.
    Shutdown(RpcReplyPort<()>),
}

impl ConnectionFailure {
    /// How the connection ended, for the restart policy: a clean exit (status 0) is not
    /// a crash, and a connect failure that cannot heal must not be retried.
    pub(crate) fn classify(&self) -> (ExitKind, bool) {
        match self {
            ConnectionFailure::Transport(TransportError::Closed {
                exit: Some(status), ..
            }) if status.success() => (ExitKind::Normal, false),
            ConnectionFailure::Connect(e) => (ExitKind::Abnormal, e.cannot_heal()),
            ConnectionFailure::Transport(_) => (ExitKind::Abnormal, false),
        }
    }
}

/// What a connection actor is started with.
pub struct ConnArgs {
    pub(crate) server: String,
    pub(crate) spec: TransportSpec,
    pub(crate) options: ConnectOptions,
    pub(crate) allow_unsolicited_input: bool,
    pub(crate) parent: ActorRef<ServerMsg>,
    pub(crate) attempt: u64,
    /// Cancelled when the attempt is given up (shutdown, restart): a connect still under
    /// way ends at once, its process group killed with it, instead of holding the stop
    /// for up to the probe's and handshake's timeouts.
    pub(crate) given_up: tokio_util::sync::CancellationToken,
}

/// SIGKILLs a stdio connection's process group when dropped, unless disarmed.
struct KillOnDrop {
    conn: Arc<Connection>,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.conn.kill();
        }
    }
}

/// The state of a connection actor: empty until connected.
pub struct ConnState {
    args: ConnArgs,
    live: Option<KillOnDrop>,
}

/// Owns one connection; see the module docs.
pub struct ConnectionActor;

impl Actor for ConnectionActor {
    type Msg = ConnMsg;
    type State = ConnState;
    type Arguments = ConnArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ConnMsg>,
        args: ConnArgs,
    ) -> Result<ConnState, ActorProcessingErr> {
        // Connecting happens in post_start so that spawning returns at once.
        Ok(ConnState { args, live: None })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ConnMsg>,
        state: &mut ConnState,
    ) -> Result<(), ActorProcessingErr> {
        let a = &state.args;
        let connect = Connection::connect_with(
            &a.server,
            a.spec.clone(),
            a.options.clone(),
            a.allow_unsolicited_input,
        );
        let connected = tokio::select! {
            connected = connect => connected,
            // Given up: the dropped connect future kills the process group it spawned
            // (and ends a sign-in under way with it, as any cancelled request does); the
            // shutdown that follows finds nothing live.
            () = a.given_up.cancelled() => return Ok(()),
        };
        let (conn, mut events) = connected.map_err(ConnectionFailure::from)?;
        let conn = Arc::new(conn);
        state.live = Some(KillOnDrop {
            conn: conn.clone(),
            armed: true,
        });
        tokio::spawn(async move {
            let on_the_way = OnTheWay::default();
            while let Some(event) = events.recv().await {
                // Only what the server actor acts on crosses the actors' mailboxes,
                // which have no bound, and of a flood of `list_changed` only one of
                // each list at a time: the rest (log messages, progress of no call, the
                // same list changed again) stops here, at the transport's bounded
                // channel. (Requests hold a permit of the transport's while they wait.)
                let mut queued = None;
                if let ServerEvent::Notification(n) = &event {
                    if !ListsChanged::concerns(&n.method) {
                        tracing::trace!(method = %crate::util::text::one_line(&n.method, 100), "server notification not acted on");
                        continue;
                    }
                    queued = on_the_way.take(&n.method);
                    if queued.is_none() {
                        tracing::trace!(method = %crate::util::text::one_line(&n.method, 100), "list change already on its way");
                        continue;
                    }
                }
                if myself.send_message(ConnMsg::Event(event, queued)).is_err() {
                    return;
                }
            }
        });
        let _ = a.parent.send_message(ServerMsg::ConnectionUp {
            attempt: a.attempt,
            conn,
        });
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ConnMsg>,
        msg: ConnMsg,
        state: &mut ConnState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConnMsg::Event(ServerEvent::Closed(error), _) => {
                Err(ConnectionFailure::Transport(error).into())
            }
            ConnMsg::Event(event, queued) => {
                let _ = state.args.parent.send_message(ServerMsg::Inbound {
                    attempt: state.args.attempt,
                    event,
                    queued,
                });
                Ok(())
            }
            ConnMsg::Shutdown(reply) => {
                shut_down(state).await;
                let _ = reply.send(());
                myself.stop(None);
                Ok(())
            }
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ConnMsg>,
        state: &mut ConnState,
    ) -> Result<(), ActorProcessingErr> {
        shut_down(state).await;
        Ok(())
    }
}

async fn shut_down(state: &mut ConnState) {
    if let Some(mut live) = state.live.take() {
        live.conn.shutdown().await;
        // The group is reaped and swept; its id may now be reused.
        live.armed = false;
    }
}
