//! [`ServerRef`]: the one way into a server. It holds what the server's actor publishes
//! (status, the ready connection, what the server offers) and the actor's address, and
//! its [`ServerRef::request`] hides whether a request runs on the published connection
//! straight from the caller's task or waits in the actor's queue while the server
//! (re)starts. The server's default deadline is applied here and nowhere else; so is
//! its in-flight limit.
//!
//! Writers: the server's actor writes status, connection and offers (the one writer of
//! a server's status); its supervisor writes the actor's address when it rebuilds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use ractor::ActorRef;
use serde_json::Value;

use super::config::ServerConfig;
use super::error::ServerError;
use super::msg::ServerMsg;
use super::queue::{Outgoing, StillWanted};
use super::restart::RestartTracker;
use super::status::{ServerState, ServerStatus};
use crate::transport::{Connection, Era, RequestError, RequestOptions, TransportError};

/// How long past a request's deadline its caller waits for the server actor's answer,
/// which comes by the deadline (the queue's expiry, the transport's own bound; a token
/// refresh the request began goes on without it): enough for that answer to win the
/// race at the deadline, and no more for an actor that is busy or wedged.
const ACTOR_MARGIN: Duration = Duration::from_millis(250);

/// A ready connection, and the connection attempt it belongs to.
#[derive(Clone)]
pub(crate) struct LiveConnection {
    pub(crate) conn: Arc<Connection>,
    pub(crate) attempt: u64,
}

/// Which kinds of items a connected server says it has (from its capabilities).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offers {
    /// `capabilities.tools`.
    pub tools: bool,
    /// `capabilities.prompts`.
    pub prompts: bool,
    /// `capabilities.resources`.
    pub resources: bool,
}

impl Offers {
    /// Reads a `ServerCapabilities` object.
    pub fn of(capabilities: &Value) -> Offers {
        Offers {
            tools: capabilities.get("tools").is_some(),
            prompts: capabilities.get("prompts").is_some(),
            resources: capabilities.get("resources").is_some(),
        }
    }
}

/// What one server's actor publishes; see the module docs.
pub(crate) struct ServerShared {
    config: ServerConfig,
    /// The id, shared: an answer names its server without a copy.
    id: Arc<str>,
    fingerprint: String,
    pub(super) status: RwLock<ServerStatus>,
    pub(super) live: RwLock<Option<LiveConnection>>,
    /// `None` until the server has connected once.
    pub(super) offers: RwLock<Option<Offers>>,
    pub(super) actor: RwLock<Option<ActorRef<ServerMsg>>>,
    /// The restart history, here rather than in the actor: a rebuilt actor goes on
    /// with it, so that an actor that keeps dying cannot make its server's restarts
    /// unlimited.
    pub(super) restarts: parking_lot::Mutex<RestartTracker>,
    in_flight: AtomicUsize,
    /// The last connection attempt's number, here rather than in the actor: numbers
    /// stay unique across a rebuilt actor, so that a report about a dead actor's
    /// connection (still in use by a call that began on it) is never taken for one
    /// about the new actor's.
    pub(super) attempts: std::sync::atomic::AtomicU64,
    /// The add request that put it in the directory: an add asked again after its
    /// supervisor died before answering finds its own server, not a duplicate.
    added_by: u64,
    /// Put in the directory by an add whose client has not been told yet
    /// ([`super::ClientSide::added`]): told once its actor is started, by whichever
    /// supervisor starts it.
    pub(super) unannounced: std::sync::atomic::AtomicBool,
    /// Requests of no call (an embedder's own request; not listings) now on a legacy
    /// connection or in the actor's queue: a legacy server's questions meanwhile may
    /// be theirs, so they are no known call's.
    unowned: parking_lot::Mutex<Unowned>,
    /// Walks of its lists fetching pages now (see [`MAX_FETCHING_WALKS`]).
    fetching: Arc<tokio::sync::Semaphore>,
    /// Cancelled once the server this one replaces (same id, a reloaded config) has
    /// stopped: this one connects only then, since both may need one resource (a port,
    /// a lock file, a database opened for writing).
    predecessor: Option<tokio_util::sync::CancellationToken>,
    /// Cancelled once it has stopped for good, removed or replaced
    /// ([`super::directory::Directory::stopped`]).
    gone: tokio_util::sync::CancellationToken,
    /// [`ServerConfig::identity`], made once.
    identity: Arc<str>,
    /// The ends of the processes its connections spawned (stdio) that may still be
    /// there: a rebuilt actor waits for them (a handover's or a replaced connection's
    /// may outlive a newer one). Those gone are dropped at each spawn.
    processes: parking_lot::Mutex<Vec<crate::transport::ProcessExit>>,
}

/// Walks of one server's lists that may fetch pages at once. Each holds up to
/// `max_list_bytes` of pages while it walks; walks of one list for one identity share
/// one fetch (`call::listing`), so this bounds the walks of many identities' lists.
/// The others wait (within their deadlines), and find the cache filled when they may.
pub(crate) const MAX_FETCHING_WALKS: usize = 8;

/// The requests of no call on a server now, and a token cancelled when the last one
/// ends: a question asked during them (an approval queued, a prompt shown) is then
/// withdrawn, as a call's is when the call ends.
#[derive(Default)]
struct Unowned {
    count: usize,
    ended: Option<tokio_util::sync::CancellationToken>,
}

/// Holds one request of no call on a server until dropped.
struct UnownedSlot<'a>(&'a parking_lot::Mutex<Unowned>);

impl<'a> UnownedSlot<'a> {
    fn count(unowned: &'a parking_lot::Mutex<Unowned>) -> UnownedSlot<'a> {
        unowned.lock().count += 1;
        UnownedSlot(unowned)
    }
}

impl Drop for UnownedSlot<'_> {
    fn drop(&mut self) {
        let mut unowned = self.0.lock();
        unowned.count = unowned.count.saturating_sub(1);
        if unowned.count == 0
            && let Some(ended) = unowned.ended.take()
        {
            ended.cancel();
        }
    }
}

/// The one way into a server; cheap to clone.
#[derive(Clone)]
pub struct ServerRef(pub(crate) Arc<ServerShared>);

/// Holds one count of a server's in-flight counter.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    /// Counts one until the slot drops; also returns the count before.
    fn count(counter: &'a AtomicUsize) -> (Slot<'a>, usize) {
        let before = counter.fetch_add(1, Ordering::SeqCst);
        (Slot(counter), before)
    }
}

/// One request to a server, borrowed: what [`ServerRef::request_noting`] takes.
#[derive(Clone, Copy)]
pub(crate) struct OutgoingRef<'a> {
    /// The JSON-RPC method.
    pub method: &'a str,
    /// Its params (the connection adds the `_meta` envelope).
    pub params: Option<&'a Value>,
    /// Its deadline; the server's configured one when `None`.
    pub timeout: Option<Duration>,
    /// The client capabilities it declares, when not the connection's own.
    pub capabilities: Option<&'a Value>,
    /// Whose credentials it goes with (servers that sign in per identity).
    pub identity: Option<&'a str>,
    /// The call it is made for: a legacy HTTP server's questions during it say so.
    pub owner: Option<u64>,
    /// Made when the request must wait for the server (not ready): asked before the
    /// request goes out, false withdraws it.
    pub still_wanted: Option<&'a (dyn Fn() -> StillWanted + Sync)>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ServerRef {
    /// A server not started yet, added by request `added_by`.
    pub(crate) fn added(config: ServerConfig, added_by: u64) -> ServerRef {
        ServerRef::new(config, added_by, None)
    }

    /// A server not started yet that replaces another of its id (by request
    /// `added_by`): it connects once `predecessor` is cancelled.
    pub(crate) fn replacing(
        config: ServerConfig,
        added_by: u64,
        predecessor: tokio_util::sync::CancellationToken,
    ) -> ServerRef {
        ServerRef::new(config, added_by, Some(predecessor))
    }

    fn new(
        config: ServerConfig,
        added_by: u64,
        predecessor: Option<tokio_util::sync::CancellationToken>,
    ) -> ServerRef {
        let status = ServerStatus::starting(&config.id);
        let fingerprint = config.transport.fingerprint();
        let config_identity = config.identity();
        let restarts = RestartTracker::new(config.restart.clone(), config.max_restarts());
        ServerRef(Arc::new(ServerShared {
            id: config.id.as_str().into(),
            restarts: parking_lot::Mutex::new(restarts),
            config,
            fingerprint,
            status: RwLock::new(status),
            live: RwLock::new(None),
            offers: RwLock::new(None),
            actor: RwLock::new(None),
            in_flight: AtomicUsize::new(0),
            attempts: std::sync::atomic::AtomicU64::new(0),
            added_by,
            unannounced: std::sync::atomic::AtomicBool::new(false),
            unowned: parking_lot::Mutex::new(Unowned::default()),
            fetching: Arc::new(tokio::sync::Semaphore::new(MAX_FETCHING_WALKS)),
            predecessor,
            gone: tokio_util::sync::CancellationToken::new(),
            identity: config_identity.into(),
            processes: parking_lot::Mutex::default(),
        }))
    }

    /// Its processes that are still there.
    pub(crate) fn live_processes(&self) -> Vec<crate::transport::ProcessExit> {
        let mut all = self.0.processes.lock();
        all.retain(|p| !p.is_gone());
        all.clone()
    }

    /// How many connections were begun (for tests).
    #[cfg(test)]
    pub(crate) fn attempts(&self) -> u64 {
        self.0.attempts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes a process a connection spawned (for tests; connections say it through
    /// [`Self::spawn_hook`]).
    #[cfg(test)]
    pub(crate) fn spawned(&self, process: crate::transport::ProcessExit) {
        self.0.processes.lock().push(process);
    }

    /// What a connection tells of the processes it spawns ([`Self::live_processes`]);
    /// holds the server weakly (the connection is held by the server).
    pub(crate) fn spawn_hook(&self) -> crate::transport::SpawnHook {
        let server = Arc::downgrade(&self.0);
        crate::transport::SpawnHook(Arc::new(move |process| {
            if let Some(server) = server.upgrade() {
                let mut all = server.processes.lock();
                all.retain(|p| !p.is_gone());
                all.push(process);
            }
        }))
    }

    /// What the server is ([`ServerConfig::identity`]).
    pub(crate) fn identity(&self) -> &Arc<str> {
        &self.0.identity
    }

    /// Cancelled once it has stopped for good, removed or replaced.
    pub(super) fn gone(&self) -> &tokio_util::sync::CancellationToken {
        &self.0.gone
    }

    /// While the server this one replaces is still stopping, what is cancelled once
    /// it has.
    pub(super) fn predecessor_stopping(&self) -> Option<tokio_util::sync::CancellationToken> {
        self.0
            .predecessor
            .as_ref()
            .filter(|t| !t.is_cancelled())
            .cloned()
    }

    /// The add request that put it in the directory.
    pub(crate) fn added_by(&self) -> u64 {
        self.0.added_by
    }

    /// A place among the walks of its lists that fetch pages, once one is free.
    pub(crate) async fn fetching_walk(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.0.fetching.clone().acquire_owned().await.ok()
    }

    /// The server's id.
    pub fn id(&self) -> &str {
        &self.0.config.id
    }

    /// The server's id, shared.
    pub(crate) fn shared_id(&self) -> Arc<str> {
        self.0.id.clone()
    }

    /// Its configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.0.config
    }

    /// A digest of how it is reached (see [`crate::transport::TransportSpec::fingerprint`]).
    pub fn fingerprint(&self) -> &str {
        &self.0.fingerprint
    }

    /// A snapshot of its status.
    pub fn status(&self) -> ServerStatus {
        self.0.status.read().clone()
    }

    /// Whether `identity` holds a token for it (HTTP servers that need sign-in).
    pub fn signed_in(&self, identity: Option<&str>) -> bool {
        self.0
            .live
            .read()
            .as_ref()
            .is_some_and(|l| l.conn.signed_in(identity))
    }

    /// The live connection, if there is one (sign-in ahead of a call).
    pub fn connection(&self) -> Option<Arc<Connection>> {
        self.0.live.read().as_ref().map(|l| l.conn.clone())
    }

    /// Its lifecycle state.
    pub fn state(&self) -> ServerState {
        self.0.status.read().state
    }

    /// What it offers, once it has connected.
    pub fn offers(&self) -> Option<Offers> {
        *self.0.offers.read()
    }

    /// Its current actor.
    pub fn actor(&self) -> Option<ActorRef<ServerMsg>> {
        self.0.actor.read().clone()
    }

    /// Whether its ready connection speaks `version` (true when none is ready: nothing
    /// says otherwise yet); allocates nothing.
    pub fn protocol_version_is(&self, version: &str) -> bool {
        self.0
            .live
            .read()
            .as_ref()
            .is_none_or(|l| l.conn.protocol_version_is(version))
    }

    /// The protocol version of its ready connection, else of the last one it had (while
    /// it restarts); `None` before it first connected.
    pub(crate) fn last_protocol_version(&self) -> Option<String> {
        self.protocol_version()
            .or_else(|| self.0.status.read().protocol_version.clone())
    }

    /// The protocol version of its ready connection.
    pub fn protocol_version(&self) -> Option<String> {
        self.0
            .live
            .read()
            .as_ref()
            .map(|l| l.conn.protocol_version())
    }

    /// Sends one request (the connection adds the `_meta` envelope) within `timeout`,
    /// or the server's configured deadline when `None`. While the server is ready the
    /// request runs on its connection from this task, its params written where they
    /// are (or from a copy that carries the current trace context); otherwise it waits
    /// in the actor's queue (with a copy of them) for the (re)start, up to its deadline.
    ///
    /// A request of no call: while it is on a legacy connection, that server's own
    /// requests are no known call's (see [`ServerRef::unowned_requests_end`]), unless it
    /// is a listing or a ping (a server does not ask its questions during those, and the
    /// harness re-lists on its own whenever a server says its lists changed).
    ///
    /// # Cancel safety
    /// Dropping the future cancels the request (on the server too, once sent).
    pub async fn request(
        &self,
        method: &str,
        params: Option<&Value>,
        timeout: Option<Duration>,
        capabilities: Option<&Value>,
        identity: Option<&str>,
    ) -> Result<Value, ServerError> {
        let outgoing = OutgoingRef {
            method,
            params,
            timeout,
            capabilities,
            identity,
            owner: None,
            still_wanted: None,
        };
        // A listing is not what a server asks its questions during.
        let listing = method.ends_with("/list") || method == "ping";
        self.request_noting(outgoing, || {
            (!listing).then(|| UnownedSlot::count(&self.0.unowned))
        })
        .await
    }

    /// Whether requests of no call are on a legacy connection of this server (or
    /// waiting for one) now: a question the server sends meanwhile may be theirs.
    pub(crate) fn has_unowned_requests(&self) -> bool {
        self.0.unowned.lock().count > 0
    }

    /// While requests of no call are on this server, a token cancelled when the last
    /// of them ends; `None` when there are none.
    pub(crate) fn unowned_requests_end(&self) -> Option<tokio_util::sync::CancellationToken> {
        let mut unowned = self.0.unowned.lock();
        if unowned.count == 0 {
            return None;
        }
        Some(
            unowned
                .ended
                .get_or_insert_with(tokio_util::sync::CancellationToken::new)
                .clone(),
        )
    }

    /// [`ServerRef::request`], calling `note` first, and holding what it returns until
    /// the answer, whenever the request may meet the server's own requests
    /// (elicitation, sampling, roots): on a legacy connection, or through the actor,
    /// whose next connection may be of either era. On a modern connection it is not
    /// called: 2026-07-28 servers send no requests, and the connection refuses them.
    /// The era is read from the connection the request actually takes, so that a
    /// request cannot reach a legacy connection unnoted.
    pub(crate) async fn request_noting<G>(
        &self,
        outgoing: OutgoingRef<'_>,
        note: impl FnOnce() -> G,
    ) -> Result<Value, ServerError> {
        let OutgoingRef {
            method,
            params,
            timeout,
            capabilities,
            identity,
            owner,
            still_wanted,
        } = outgoing;
        let options = RequestOptions {
            capabilities,
            identity,
            owner,
        };
        let timeout = timeout.unwrap_or(self.0.config.timeout);
        let _slot = self.admit()?;
        // Taken here, on the caller's task, whichever way the request goes next.
        let traced = crate::util::trace_context::with_context(params);
        let live = self.0.live.read().clone();
        // Ready and open: straight to the connection. A connection that has just ended
        // goes through the actor, which holds the request for the restart.
        if let Some(live) = live.filter(|l| !l.conn.is_closed()) {
            let _noted = (live.conn.era() != Era::Modern).then(note);
            let params = traced.as_ref().or(params);
            return self
                .on_connection(&live, method, params, timeout, options)
                .await;
        }
        // Stopped or failed: answered here as the actor would, and at once. A server
        // being stopped (removed, the harness shutting down) may hold its actor for
        // seconds while its process exits, and requests would wait in its mailbox.
        {
            let status = self.0.status.read();
            match status.state {
                ServerState::Stopped => {
                    return Err(ServerError::Stopped {
                        server: self.id().to_string(),
                    });
                }
                ServerState::Failed => {
                    return Err(ServerError::Failed {
                        server: self.id().to_string(),
                        reason: status.last_error.clone().unwrap_or_default(),
                    });
                }
                _ => {}
            }
        }
        let _noted = note();
        self.through_actor(
            Outgoing {
                method: method.to_string(),
                params: traced.or_else(|| params.cloned()),
                capabilities: capabilities.cloned(),
                identity: identity.map(String::from),
                owner,
                deadline: crate::util::duration::after(std::time::Instant::now(), timeout),
                still_wanted: still_wanted.map(|make| make()),
            },
            timeout,
        )
        .await
    }

    fn admit(&self) -> Result<Slot<'_>, ServerError> {
        let limit = self.0.config.max_in_flight;
        let (slot, before) = Slot::count(&self.0.in_flight);
        if before >= limit {
            return Err(ServerError::Overloaded {
                server: self.id().to_string(),
                capacity: limit,
            });
        }
        Ok(slot)
    }

    /// One request on a ready connection, with the server's id on its error. An HTTP
    /// connection that can serve no more ([`TransportError::ends_connection`]) is
    /// reported to the actor as lost.
    pub(super) async fn on_connection(
        &self,
        live: &LiveConnection,
        method: &str,
        params: Option<&Value>,
        timeout: Duration,
        options: RequestOptions<'_>,
    ) -> Result<Value, ServerError> {
        let conn = &live.conn;
        let result = conn.request_as(method, params, timeout, options).await;
        if conn.is_http()
            && let Err(RequestError::Transport(error)) = &result
            && error.ends_connection()
            && let Some(actor) = self.actor()
        {
            let lost = ServerMsg::ConnectionLost {
                attempt: live.attempt,
                error: error.clone(),
            };
            let _ = actor.send_message(lost);
        }
        result.map_err(|e| ServerError::from_request(self.id(), e))
    }

    async fn through_actor(
        &self,
        outgoing: Outgoing,
        timeout: Duration,
    ) -> Result<Value, ServerError> {
        let unavailable = || ServerError::Unavailable {
            server: self.id().to_string(),
        };
        let Some(actor) = self.actor() else {
            return Err(unavailable());
        };
        // The actor answers by the request's deadline, which counts from here; the
        // margin only guards against a wedged actor.
        let limit = outgoing.left().saturating_add(ACTOR_MARGIN);
        let (reply, rx) = tokio::sync::oneshot::channel();
        let message = ServerMsg::Request { outgoing, reply };
        actor.send_message(message).map_err(|_| unavailable())?;
        match tokio::time::timeout(limit, rx).await {
            // The caller's deadline, not what was left of it when the actor sent it.
            Ok(Ok(Err(ServerError::Transport {
                server,
                source: TransportError::Timeout(_),
            }))) => Err(ServerError::Transport {
                server,
                source: TransportError::Timeout(timeout),
            }),
            Ok(Ok(result)) => result,
            // The actor died holding the request, unsent (it is being rebuilt): one
            // it had sent answers for itself even when lost (`SentReply`).
            Ok(Err(_)) => Err(unavailable()),
            Err(_) => Err(ServerError::Transport {
                server: self.id().to_string(),
                source: TransportError::Timeout(timeout),
            }),
        }
    }
}
