//! `ServersSupervisor`: owns every `ServerActor`. It starts one per server, rebuilds a
//! server's actor from its arguments when the actor itself dies (killed, or a panic),
//! and never stops because a child did. It writes the [`Directory`] that calls read.
//!
//! It never waits on a slow child inside `handle`: stopping a server (removal, shutdown)
//! runs in a task that answers the caller's reply port when the server is gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::actor::{ServerActor, ServerArgs, Start};
use super::client::{ClientSide, ListsChanged};
use super::config::ServerConfig;
use super::directory::Directory;
use super::error::ServerError;
use super::msg::ServerMsg;
use super::server_ref::ServerRef;
use super::status::ServerState;
use crate::transport::ConnectOptions;
use crate::util::slot::ActorSlot;

/// Why a server could not be added or found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServersError {
    /// A server with this id exists already.
    #[error("a server named {0:?} exists already")]
    Duplicate(String),
    /// No server has this id.
    #[error("no server named {0:?}")]
    Unknown(String),
    /// Its actor could not be started.
    #[error("could not start server {server:?}: {reason}")]
    Spawn {
        /// Server id.
        server: String,
        /// Why.
        reason: String,
    },
    /// The supervisor is gone (the harness is shutting down).
    #[error("the servers' supervisor is not running")]
    Gone,
    /// The server could not do what was asked (a restart its actor did not confirm).
    #[error(transparent)]
    Server(ServerError),
}

/// What a `Restart` asked of a server's actor came to: only its answer is a restart.
/// Its actor stopped without one (the server was removed meanwhile, or its actor died
/// and is being rebuilt), or did not answer in time: no restart is known to be under
/// way, and the caller is told so.
fn restarted(
    done: Result<ractor::rpc::CallResult<()>, ractor::MessagingErr<ServerMsg>>,
    id: &str,
    directory: &Directory,
) -> Result<(), ServersError> {
    use ractor::rpc::CallResult;
    match done {
        Ok(CallResult::Success(())) => Ok(()),
        _ if directory.get(id).is_none() => Err(ServersError::Unknown(id.to_string())),
        Ok(CallResult::Timeout) => Err(ServersError::Server(ServerError::Restarting {
            server: id.to_string(),
            reason: "its actor did not confirm the restart within 30 s".into(),
        })),
        Ok(CallResult::SenderError) | Err(_) => {
            Err(ServersError::Server(ServerError::Unavailable {
                server: id.to_string(),
            }))
        }
    }
}

/// Messages of the servers' supervisor.
pub enum ServersMsg {
    /// Start a new server (validated by the caller), for the add request of this
    /// number (never 0; the same when the request is asked again).
    Add(
        Box<ServerConfig>,
        u64,
        RpcReplyPort<Result<(), ServersError>>,
    ),
    /// Stop a server gracefully and forget it; answers when it is stopped.
    Remove(String, RpcReplyPort<Result<(), ServersError>>),
    /// Put a server of a new config (validated by the caller) in the place of the one
    /// of its id, for the request of this number; answers when the old one is stopped.
    Replace(
        Box<ServerConfig>,
        u64,
        RpcReplyPort<Result<(), ServersError>>,
    ),
    /// Restart a server now, forgetting its restart history.
    Restart(String, RpcReplyPort<Result<(), ServersError>>),
    /// The client's capabilities changed: tell every server.
    CapabilitiesChanged,
    /// Stop every server gracefully; answers when all are stopped.
    Shutdown(RpcReplyPort<()>),
}

/// What the servers' supervisor is started with (and rebuilt from).
#[derive(Clone)]
pub struct ServersArgs {
    pub(crate) directory: Directory,
    pub(crate) client: Arc<dyn ClientSide>,
    pub(crate) options: ConnectOptions,
}

/// The supervisor's state.
pub struct ServersState {
    args: ServersArgs,
    by_actor: HashMap<ActorId, String>,
    shutting_down: bool,
}

/// The servers' supervisor; see the module docs.
pub struct ServersSupervisor;

impl Actor for ServersSupervisor {
    type Msg = ServersMsg;
    type State = ServersState;
    type Arguments = ServersArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ServersMsg>,
        args: ServersArgs,
    ) -> Result<ServersState, ActorProcessingErr> {
        let mut state = ServersState {
            args,
            by_actor: HashMap::new(),
            shutting_down: false,
        };
        // A rebuilt supervisor starts the servers it finds in the directory again (their
        // actors died with the old one).
        for server in state.args.directory.all() {
            let start = if server.actor().is_some() {
                Start::SupervisorRebuilt
            } else {
                Start::New
            };
            match state.spawn(&myself, server.clone(), start).await {
                // An add this supervisor's predecessor died in, before it told the client.
                Ok(()) => state.announce(&server),
                Err(e) => {
                    tracing::error!(server = %server.id(), error = %e, "could not start the server's actor");
                    unspawned(&server, &e);
                }
            }
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<ServersMsg>,
        msg: ServersMsg,
        state: &mut ServersState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ServersMsg::Add(config, request, reply) => {
                // One added now would start after the servers to stop were counted, and
                // outlive the shutdown.
                let added = match state.shutting_down {
                    true => Err(ServersError::Gone),
                    false => state.add(&myself, *config, request).await,
                };
                let _ = reply.send(added);
            }
            ServersMsg::Remove(id, reply) => match state.args.directory.remove(&id) {
                Some(server) => {
                    if let Some(actor) = server.actor() {
                        state.by_actor.remove(&actor.get_id());
                    }
                    let directory = state.args.directory.clone();
                    let grace = state.args.options.shutdown_grace;
                    tokio::spawn(async move {
                        stop(&server, grace).await;
                        // And the one it replaces, if that is still stopping: a server
                        // of this id added next must not start beside it.
                        if let Some(old) = server.predecessor_stopping() {
                            old.cancelled().await;
                        }
                        directory.stopped(&server);
                        let _ = reply.send(Ok(()));
                    });
                }
                None => {
                    let _ = reply.send(Err(ServersError::Unknown(id)));
                }
            },
            ServersMsg::Replace(config, request, reply) => match state.shutting_down {
                true => {
                    let _ = reply.send(Err(ServersError::Gone));
                }
                false => state.replace(&myself, *config, request, reply).await,
            },
            ServersMsg::Restart(id, reply) => {
                if state.shutting_down {
                    let _ = reply.send(Err(ServersError::Gone));
                    return Ok(());
                }
                let server = state.args.directory.get(&id);
                if let Some(server) = server.as_ref().filter(|s| s.actor().is_none()) {
                    // Its actor could not be rebuilt: a new one starts it afresh (and
                    // is asked to restart below only if disabled, which it then starts).
                    server.0.restarts.lock().reset();
                    if let Err(e) = state.spawn(&myself, server.clone(), Start::New).await {
                        let _ = reply.send(Err(e));
                        return Ok(());
                    }
                    if server.config().enabled {
                        let _ = reply.send(Ok(()));
                        return Ok(());
                    }
                }
                match server.and_then(|s| s.actor()) {
                    Some(actor) => {
                        // The server actor answers when its new attempt is under way.
                        let directory = state.args.directory.clone();
                        tokio::spawn(async move {
                            let done = actor
                                .call(ServerMsg::Restart, Some(Duration::from_secs(30)))
                                .await;
                            let _ = reply.send(restarted(done, &id, &directory));
                        });
                    }
                    None => {
                        let _ = reply.send(Err(ServersError::Unknown(id)));
                    }
                }
            }
            ServersMsg::CapabilitiesChanged => {
                for server in state.args.directory.all() {
                    if let Some(actor) = server.actor() {
                        let _ = actor.send_message(ServerMsg::CapabilitiesChanged);
                    }
                }
            }
            ServersMsg::Shutdown(reply) => {
                state.shutting_down = true;
                // Those being removed too: a shutdown returns when no process is left.
                let mut servers = state.args.directory.all();
                servers.extend(state.args.directory.stopping());
                let grace = state.args.options.shutdown_grace;
                tokio::spawn(async move {
                    // Concurrently: one server slow to die must not hold the others up.
                    let mut stops = tokio::task::JoinSet::new();
                    for server in servers.into_iter().rev() {
                        stops.spawn(async move { stop(&server, grace).await });
                    }
                    while stops.join_next().await.is_some() {}
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ServersMsg>,
        event: SupervisionEvent,
        state: &mut ServersState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop every server with one.
        let cell = match &event {
            SupervisionEvent::ActorFailed(cell, _)
            | SupervisionEvent::ActorTerminated(cell, _, _) => cell,
            _ => return Ok(()),
        };
        let Some(id) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        let Some(server) = state.args.directory.get(&id) else {
            return Ok(());
        };
        if state.shutting_down {
            // Not rebuilt; and no actor is left to say it stopped (its connection went
            // with it): requests are answered `Stopped`, not sent to a dead connection.
            mark_stopped(&server);
            return Ok(());
        }
        tracing::warn!(server = %id, "server actor died; rebuilding it from its config");
        if let Err(e) = state.spawn(&myself, server.clone(), Start::ActorDied).await {
            tracing::error!(server = %id, error = %e, "could not rebuild the server actor");
            unspawned(&server, &e);
        }
        Ok(())
    }
}

impl ServersState {
    async fn spawn(
        &mut self,
        myself: &ActorRef<ServersMsg>,
        server: ServerRef,
        start: Start,
    ) -> Result<(), ServersError> {
        // A rebuilt actor starts with nothing published.
        *server.0.live.write() = None;
        let args = ServerArgs {
            server: server.clone(),
            client: self.args.client.clone(),
            options: self.args.options.clone(),
            start,
        };
        let (actor, _) = Actor::spawn_linked(None, ServerActor, args, myself.get_cell())
            .await
            .map_err(|e| ServersError::Spawn {
                server: server.id().to_string(),
                reason: e.to_string(),
            })?;
        self.by_actor
            .insert(actor.get_id(), server.id().to_string());
        *server.0.actor.write() = Some(actor);
        Ok(())
    }

    async fn add(
        &mut self,
        myself: &ActorRef<ServersMsg>,
        config: ServerConfig,
        request: u64,
    ) -> Result<(), ServersError> {
        // One of this id removed and still stopping (its remove given up on, or another
        // task's): the new one connects once it has, as a replacement does, since both
        // may need one resource (a port, a lock file).
        let stopping: Vec<ServerRef> = (self.args.directory.stopping().into_iter())
            .filter(|s| s.id() == config.id)
            .collect();
        let predecessor = (!stopping.is_empty()).then(tokio_util::sync::CancellationToken::new);
        let server = match &predecessor {
            None => ServerRef::added(config, request),
            Some(token) => ServerRef::replacing(config, request, token.clone()),
        };
        server.0.unannounced.store(true, Ordering::Release);
        if !insert_added(&self.args.directory, &server)? {
            // Asked again: the supervisor before this one took it in (and started it,
            // or this one did at its start); told of it if that one died first.
            if let Some(there) = self.args.directory.get(server.id())
                && there.actor().is_some()
            {
                self.announce(&there);
            }
            return Ok(());
        }
        if let Some(token) = predecessor {
            let stopped = token.drop_guard();
            tokio::spawn(async move {
                for old in stopping {
                    old.gone().cancelled().await;
                }
                drop(stopped);
            });
        }
        if let Err(e) = self.spawn(myself, server.clone(), Start::New).await {
            self.args.directory.discard(server.id());
            return Err(e);
        }
        self.announce(&server);
        Ok(())
    }

    /// Tells the client of an added server, once, now that its actor is started.
    fn announce(&self, server: &ServerRef) {
        if server.0.unannounced.swap(false, Ordering::AcqRel) {
            self.args.client.added(server.id());
        }
    }

    /// See [`ServersMsg::Replace`]. The new server keeps the old one's place (config
    /// order) and id: requests meanwhile wait in its queue, as during a restart. It
    /// connects once the old one has stopped, after the cache has dropped the old
    /// one's lists (read again from the new one, and announced as changed).
    async fn replace(
        &mut self,
        myself: &ActorRef<ServersMsg>,
        config: ServerConfig,
        request: u64,
        reply: RpcReplyPort<Result<(), ServersError>>,
    ) {
        let id = config.id.clone();
        match self.args.directory.get(&id) {
            None => {
                let _ = reply.send(Err(ServersError::Unknown(id)));
                return;
            }
            // Asked again: its supervisor died before answering; the rebuilt one
            // started it.
            Some(there) if there.added_by() == request => {
                let _ = reply.send(Ok(()));
                return;
            }
            // One at a time: the server being replaced has not stopped yet, and what
            // waits for its replacement would be stopped with it.
            Some(there) if there.predecessor_stopping().is_some() => {
                let _ = reply.send(Err(ServersError::Server(ServerError::Restarting {
                    server: id,
                    reason: "a replacement of it is under way (its old process is stopping)".into(),
                })));
                return;
            }
            Some(_) => {}
        }
        let predecessor = tokio_util::sync::CancellationToken::new();
        // Cancelled however this ends, from here: the new server never waits for ever
        // (a supervisor killed at the await below drops it with the handler).
        let stopped = predecessor.clone().drop_guard();
        let server = ServerRef::replacing(config, request, predecessor);
        let Some(old) = self.args.directory.replace(server.clone()) else {
            let _ = reply.send(Err(ServersError::Unknown(id)));
            return;
        };
        if let Some(actor) = old.actor() {
            self.by_actor.remove(&actor.get_id());
        }
        {
            // One server to whoever counts (metrics): its counts go on.
            let was = old.status();
            let mut now = server.0.status.write();
            now.restarts = was.restarts;
            now.actor_rebuilds = was.actor_rebuilds;
        }
        let (directory, client) = (self.args.directory.clone(), self.args.client.clone());
        let grace = self.args.options.shutdown_grace;
        // Stopped from now, in a task of its own: a supervisor killed at the await
        // below would otherwise leave it among the servers stopping for good (and its
        // id waiting on it: no add, remove or replacement of the id would finish).
        let old_stopped = {
            let directory = directory.clone();
            tokio::spawn(async move {
                stop(&old, grace).await;
                directory.stopped(&old);
            })
        };
        let spawned = self.spawn(myself, server.clone(), Start::New).await;
        if spawned.is_err() {
            self.args.directory.discard(&id);
        }
        tokio::spawn(async move {
            let _ = old_stopped.await;
            // Unless it was removed meanwhile.
            if directory
                .get(&id)
                .is_some_and(|s| std::sync::Arc::ptr_eq(&s.0, &server.0))
            {
                client.lists_changed(&id, ListsChanged::ALL);
            }
            drop(stopped);
            let _ = reply.send(spawned);
        });
    }
}

/// A server whose actor died while the harness stops: no actor is left to say so.
fn mark_stopped(server: &ServerRef) {
    *server.0.actor.write() = None;
    *server.0.live.write() = None;
    let mut s = server.0.status.write();
    s.state = ServerState::Stopped;
    s.pid = None;
}

/// A server whose actor could not be spawned again: no actor is left to write its
/// status, so it is failed until `restart_server` spawns one (it finds no actor).
fn unspawned(server: &ServerRef, e: &ServersError) {
    *server.0.actor.write() = None;
    let mut s = server.0.status.write();
    s.state = ServerState::Failed;
    s.last_error = Some(e.to_string());
}

/// Puts a server added at run time in the directory: true if it is new, false if the
/// same add request put it there already (asked again: its supervisor died before
/// answering; the rebuilt supervisor started it), `Duplicate` if another did.
fn insert_added(directory: &Directory, server: &ServerRef) -> Result<bool, ServersError> {
    if directory.insert(server.clone()) {
        return Ok(true);
    }
    match directory.get(server.id()) {
        Some(there) if there.added_by() == server.added_by() => Ok(false),
        _ => Err(ServersError::Duplicate(server.id().to_string())),
    }
}

/// Stops one server gracefully (stdin EOF, SIGTERM, SIGKILL, reap), then its actor,
/// given the time its actor gives its connections (and a little more): killed sooner,
/// a server with a long `shutdown_grace` would lose its grace.
async fn stop(server: &ServerRef, grace: Duration) {
    // No actor (it died, was not spawned again, or was marked stopped): its processes,
    // killed with it, may not be reaped yet, and are waited for all the same.
    if let Some(actor) = server.actor() {
        let limit = super::actor::stop_limit(grace).saturating_add(Duration::from_secs(5));
        let _ = actor.call(ServerMsg::Shutdown, Some(limit)).await;
        actor.kill();
    }
    // A connection killed rather than stopped (a start given up half-way, a stop past
    // its limit) had its process group SIGKILLed, and reaped later: waited for, so that
    // a removal or a shutdown answers when no process is left, and the next server of
    // this id does not start beside it (a port, a lock file).
    let processes = server.live_processes();
    if !processes.is_empty()
        && tokio::time::timeout(
            super::actor::OLD_PROCESS_WAIT,
            super::actor::all_gone(processes),
        )
        .await
        .is_err()
    {
        tracing::warn!(server = %server.id(), wait = ?super::actor::OLD_PROCESS_WAIT, "the server's process is still there after its stop");
    }
}

/// Numbers an add (or replace) request, so that asking it again after a lost answer
/// finds the server it put in the directory rather than a duplicate.
fn add_request() -> u64 {
    static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A typed handle on the servers' supervisor (its address changes when it is rebuilt),
/// and the servers' `shutdown_grace`.
#[derive(Clone)]
pub struct ServersRef(pub(crate) ActorSlot<ServersMsg>, Duration);

impl ServersRef {
    /// A handle on no supervisor yet, for servers given `grace` to stop.
    pub(crate) fn new(grace: Duration) -> ServersRef {
        ServersRef(ActorSlot::default(), grace)
    }

    /// How long a removal, replacement or shutdown is waited for: its servers' stops
    /// (each bounded by their grace) and then some. Given up on sooner, it would be
    /// taken for a harness gone while it still ran.
    fn stopping_limit(&self) -> Duration {
        super::actor::stop_limit(self.1)
            .saturating_add(Duration::from_secs(60))
            .max(Duration::from_secs(120))
    }

    /// Starts a server.
    pub async fn add(&self, config: ServerConfig) -> Result<(), ServersError> {
        let request = add_request();
        let config = Box::new(config);
        self.0
            .ask(
                |r| ServersMsg::Add(config.clone(), request, r),
                Duration::from_secs(60),
            )
            .await
            .unwrap_or(Err(ServersError::Gone))
    }

    /// Puts a server of a new config in the place of the one of its id; returns when
    /// the old one is stopped.
    pub async fn replace(&self, config: ServerConfig) -> Result<(), ServersError> {
        let request = add_request();
        let config = Box::new(config);
        self.0
            .ask(
                |r| ServersMsg::Replace(config.clone(), request, r),
                self.stopping_limit(),
            )
            .await
            .unwrap_or(Err(ServersError::Gone))
    }

    /// Stops a server and forgets it; returns when it is stopped.
    pub async fn remove(&self, id: &str) -> Result<(), ServersError> {
        self.0
            .ask(
                |r| ServersMsg::Remove(id.to_string(), r),
                self.stopping_limit(),
            )
            .await
            .unwrap_or(Err(ServersError::Gone))
    }

    /// Restarts a server now.
    pub async fn restart(&self, id: &str) -> Result<(), ServersError> {
        self.0
            .ask(
                |r| ServersMsg::Restart(id.to_string(), r),
                Duration::from_secs(60),
            )
            .await
            .unwrap_or(Err(ServersError::Gone))
    }

    /// Tells every server that the client's capabilities changed.
    pub fn capabilities_changed(&self) {
        self.0.send(ServersMsg::CapabilitiesChanged);
    }

    /// Stops every server of `directory`; returns when all are stopped. Without a
    /// `running` supervisor (it died, and is not rebuilt while the harness stops: it
    /// would start every server only to stop it), or one that does not answer, the
    /// servers' actors and processes went with it: they are marked stopped, and their
    /// processes, killed as each dying actor gets to it, are waited for (at most
    /// [`super::actor::OLD_PROCESS_WAIT`] in all).
    pub async fn shutdown(&self, directory: &Directory, running: bool) {
        if running
            && (self.0)
                .ask(ServersMsg::Shutdown, self.stopping_limit())
                .await
                .is_some()
        {
            return;
        }
        let until = tokio::time::Instant::now() + super::actor::OLD_PROCESS_WAIT;
        // Those removed or replaced whose stop was under way too: their processes are
        // as much the harness's to leave none of.
        for server in directory.all().into_iter().chain(directory.stopping()) {
            mark_stopped(&server);
            let processes = server.live_processes();
            if tokio::time::timeout_at(until, super::actor::all_gone(processes))
                .await
                .is_err()
            {
                tracing::warn!(server = %server.id(), "the server's process was not gone in time after its supervisor died");
            }
        }
    }
}

impl From<ServersError> for ServerError {
    fn from(e: ServersError) -> ServerError {
        match e {
            ServersError::Unknown(server) | ServersError::Duplicate(server) => {
                ServerError::Stopped { server }
            }
            ServersError::Spawn { server, .. } => ServerError::Unavailable { server },
            ServersError::Gone => ServerError::Unavailable {
                server: String::new(),
            },
            ServersError::Server(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::rpc::CallResult;

    #[test]
    fn a_restart_is_reported_only_when_the_actor_confirms_it() {
        let directory = Directory::default();
        assert_eq!(
            restarted(Ok(CallResult::Success(())), "s", &directory),
            Ok(())
        );
        // Removed meanwhile: its actor stopped without answering.
        for done in [CallResult::SenderError, CallResult::Timeout] {
            assert_eq!(
                restarted(Ok(done), "s", &directory),
                Err(ServersError::Unknown("s".into()))
            );
        }
        // Still there: its actor died (being rebuilt), or did not answer in time.
        directory.insert(ServerRef::added(
            ServerConfig::stdio("s", "true", [""; 0]),
            1,
        ));
        assert!(matches!(
            restarted(Ok(CallResult::SenderError), "s", &directory),
            Err(ServersError::Server(ServerError::Unavailable { .. }))
        ));
        assert!(matches!(
            restarted(Ok(CallResult::Timeout), "s", &directory),
            Err(ServersError::Server(ServerError::Restarting { .. }))
        ));
    }

    /// A client that notes the servers it is told were added.
    #[derive(Default)]
    struct Told(parking_lot::Mutex<Vec<String>>);

    impl ClientSide for Told {
        fn capabilities(&self) -> serde_json::Value {
            serde_json::json!({})
        }
        fn answer(&self, _: &str, request: crate::transport::ServerRequest) {
            drop(request);
        }
        fn lists_changed(&self, _: &str, _: crate::server::ListsChanged) {}
        fn progress(&self, _: &str, _: Option<&serde_json::Value>) {}
        fn added(&self, server: &str) {
            self.0.lock().push(server.to_string());
        }
    }

    /// An add whose supervisor died after it put the server in the directory, before
    /// it told the client, is told by the supervisor rebuilt after it, and only once
    /// when the add is asked again.
    #[tokio::test]
    async fn an_add_whose_supervisor_died_before_telling_is_told_by_the_next_one() {
        let config = |id: &str| {
            let mut c = ServerConfig::stdio(id, "true", [""; 0]);
            c.enabled = false;
            c
        };
        let (directory, told) = (Directory::default(), Arc::new(Told::default()));
        let left = ServerRef::added(config("s"), 7);
        left.0.unannounced.store(true, Ordering::Release);
        directory.insert(left);
        let args = ServersArgs {
            directory: directory.clone(),
            client: told.clone(),
            options: ConnectOptions::default(),
        };
        let (supervisor, handle) = Actor::spawn(None, ServersSupervisor, args)
            .await
            .expect("spawn");
        assert_eq!(
            *told.0.lock(),
            ["s"],
            "told at the rebuilt supervisor's start"
        );
        let add = |id: &str, request| {
            let config = Box::new(config(id));
            supervisor.call(move |r| ServersMsg::Add(config, request, r), None)
        };
        let again = add("s", 7).await.expect("asked");
        assert!(matches!(again, CallResult::Success(Ok(()))));
        let fresh = add("t", 8).await.expect("asked");
        assert!(matches!(fresh, CallResult::Success(Ok(()))));
        assert_eq!(*told.0.lock(), ["s", "t"], "each once");
        supervisor.stop(None);
        let _ = handle.await;
    }

    #[test]
    fn an_add_asked_again_finds_its_own_server_and_another_add_a_duplicate() {
        let directory = Directory::default();
        let config = || ServerConfig::stdio("s", "true", [""; 0]);
        assert_eq!(
            insert_added(&directory, &ServerRef::added(config(), 7)),
            Ok(true)
        );
        // The same request again (its first answer was lost with a killed supervisor).
        assert_eq!(
            insert_added(&directory, &ServerRef::added(config(), 7)),
            Ok(false)
        );
        assert_eq!(directory.all().len(), 1);
        // Another request for the same id.
        assert_eq!(
            insert_added(&directory, &ServerRef::added(config(), 8)),
            Err(ServersError::Duplicate("s".into()))
        );
    }
}
