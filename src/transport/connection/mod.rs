//! One connection to one MCP server: era detection, the `_meta` envelope, and the
//! server's own traffic.
//!
//! [`Connection::connect`] opens the transport and identifies the server ([`probe`],
//! spec section H), falling back to the legacy handshake ([`handshake`]); a stdio
//! server that exits on the probe is respawned and goes straight to `initialize`.
//!
//! A request reads: stamp, send, renegotiate once. Every request to a modern server
//! carries the full `_meta` envelope; a -32022 whose `data.supported` names one of our
//! versions switches to it (or, when it names the version just sent, simply tries
//! again) and retries once with a new id, within the request's one deadline. Legacy
//! servers get plain legacy requests: they took our capabilities at `initialize`, and
//! dual-era servers (rmcp 3.11 among them) treat a request carrying the modern envelope
//! as a stateless modern request, outside the legacy session. What only HTTP needs
//! (`Mcp-Param` headers, renewing a legacy session) lives behind the HTTP transport.
//!
//! Server-to-client traffic goes up as [`ServerEvent`]s ([`dispatch`]) on a bounded
//! channel that the caller drains.
//!
//! Dropping a [`Connection`] kills a stdio server's process group at once;
//! [`Connection::shutdown`] stops it gracefully.

mod dispatch;
mod handshake;
mod listen;
mod options;
mod probe;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

pub use options::{
    AskedDuring, ConnectOptions, Era, EraPreference, RequestOptions, ServerEvent, ServerProfile,
    ServerRequest,
};

use super::Transport;
use super::error::{ConnectError, RequestError, TransportError};
use super::inbound::{Ids, Queued};
use super::spec::TransportSpec;
use crate::protocol::{
    MetaEnvelope, Notification, RequestId, RequestRef, RpcError, RpcErrorKind, Stamp,
};
use dispatch::Dispatch;
use handshake::{answering_pings, envelope, initialize, pick_version};
use probe::{Probe, probe};

/// The methods that are calls (they may carry `input_required` rounds and legitimize a
/// legacy server's questions to the client).
const CALL_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// Requests a legacy server may have waiting for our answers at once.
const MAX_SERVER_REQUESTS: usize = 4;

/// A connected, identified MCP server.
pub struct Connection {
    server: String,
    transport: Arc<Transport>,
    options: ConnectOptions,
    profile: ServerProfile,
    envelope: RwLock<Arc<MetaEnvelope>>,
    ids: Ids,
    /// Every request in flight on this connection.
    in_flight: AtomicUsize,
    /// The calls among them (see [`CALL_METHODS`]).
    calls_in_flight: Arc<AtomicUsize>,
    /// Open `subscriptions/listen` requests, whose notifications the dispatcher routes.
    subscriptions: listen::Subscriptions,
    /// Whom each request in flight on a legacy HTTP connection is for: the server's
    /// requests on its event stream are theirs.
    owners: dispatch::Owners,
    dispatcher: JoinHandle<()>,
    /// A request timed out while a stdio server said nothing at all
    /// ([`Connection::timed_out_silently`]).
    silent: tokio::sync::Notify,
    /// Requests in flight given longer than the connection's own timeout
    /// ([`Connection::waits_long`]).
    long_in_flight: AtomicUsize,
    /// The lists (by capability, [`LISTED_CAPABILITIES`]) whose changes a subscription
    /// on this connection says it announces now ([`Connection::set_announced`]).
    announced: std::sync::atomic::AtomicU8,
}

/// The capabilities whose lists a subscription announces, by their bit in
/// [`Connection::set_announced`].
pub(crate) const LISTED_CAPABILITIES: [&str; 3] = ["tools", "prompts", "resources"];

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .field("era", &self.profile.era())
            .field("version", &self.profile.protocol_version())
            .field("pid", &self.pid())
            .finish()
    }
}

/// Counts one request in flight until dropped.
struct Counted<'a> {
    all: &'a AtomicUsize,
    calls: Option<&'a AtomicUsize>,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.all.fetch_sub(1, Ordering::SeqCst);
        if let Some(c) = self.calls {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Which id a request went out under last, recorded on the span current when it began
/// (`jsonrpc.request.id`, a string by the conventions) once, when it ends or is dropped:
/// a request sent again under a new id (a renegotiated version, a sign-in, a renewed
/// session) is the id the server answered, not one attribute per try. A span without
/// the field ignores it.
struct SentId {
    span: tracing::Span,
    id: RequestId,
}

impl Drop for SentId {
    fn drop(&mut self) {
        if let RequestId::Number(n) = self.id {
            let mut digits = itoa::Buffer::new();
            self.span.record("jsonrpc.request.id", digits.format(n));
        }
    }
}

/// A request's entry in [`Connection::owners`], removed when dropped.
struct Owned<'a> {
    owners: &'a dispatch::Owners,
    id: RequestId,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        self.owners.lock().remove(&self.id);
    }
}

/// `result`, the transport stopped first when it is an error: a failed start is stopped
/// as any server is (stdin closed, then SIGTERM), not killed outright when the transport
/// is dropped (a wrapper such as `docker run` killed outright leaves its container).
async fn stopped_if_failed<T>(
    transport: &Transport,
    options: &ConnectOptions,
    result: Result<T, ConnectError>,
) -> Result<T, ConnectError> {
    if result.is_err() {
        transport.shutdown(options.shutdown_grace).await;
    }
    result
}

async fn open(
    server: &str,
    spec: &TransportSpec,
    options: &ConnectOptions,
    ids: &Ids,
) -> Result<(Arc<Transport>, mpsc::Receiver<Queued>), TransportError> {
    let (tx, rx) = mpsc::channel(options.event_capacity.max(1));
    let transport = Transport::open(
        server,
        spec,
        ids.clone(),
        crate::transport::inbound::InboundSink::new(tx, options.progress.clone()),
        options,
    )
    .await?;
    Ok((Arc::new(transport), rx))
}

/// The legacy handshake; when it fails once begun (a version this client does not
/// speak, `initialized` not delivered), the transport is shut down, so a session the
/// server began is ended rather than left to expire.
async fn legacy_handshake(
    transport: &Arc<Transport>,
    inbound: &mut mpsc::Receiver<Queued>,
    held: &mut Vec<Queued>,
    ids: &Ids,
    options: &ConnectOptions,
) -> Result<crate::protocol::views::InitializeResult, ConnectError> {
    let result = initialize_answering_pings(transport, inbound, held, ids, options).await;
    stopped_if_failed(transport, options, result).await
}

/// `initialize` and `initialized`, the server's pings answered meanwhile; the transport
/// is left as it is whatever comes of it.
async fn initialize_answering_pings(
    transport: &Arc<Transport>,
    inbound: &mut mpsc::Receiver<Queued>,
    held: &mut Vec<Queued>,
    ids: &Ids,
    options: &ConnectOptions,
) -> Result<crate::protocol::views::InitializeResult, ConnectError> {
    let handshake = initialize(transport, ids, options);
    let limit = options.event_capacity.max(1);
    let timeout = options.request_timeout;
    answering_pings(transport, inbound, held, limit, timeout, handshake).await
}

impl Connection {
    /// Opens the transport and identifies the server. Returns the connection and the
    /// channel of [`ServerEvent`]s, which the caller must drain (or drop).
    pub async fn connect(
        server: &str,
        spec: TransportSpec,
        options: ConnectOptions,
    ) -> Result<(Connection, mpsc::Receiver<ServerEvent>), ConnectError> {
        Self::connect_with(server, spec, options, false).await
    }

    /// [`Connection::connect`]; `allow_unsolicited_input` lets a legacy server ask for
    /// elicitation or sampling while none of our calls is in flight.
    pub async fn connect_with(
        server: &str,
        spec: TransportSpec,
        options: ConnectOptions,
        allow_unsolicited_input: bool,
    ) -> Result<(Connection, mpsc::Receiver<ServerEvent>), ConnectError> {
        let ids = Ids::new();
        let (mut transport, mut inbound) = open(server, &spec, &options, &ids).await?;
        // What the server sent during a legacy handshake besides pings and replies.
        let mut held = Vec::new();
        let probe = match options.era {
            EraPreference::Legacy => Probe::Legacy("configured as legacy".into()),
            EraPreference::Auto | EraPreference::Modern => {
                stopped_if_failed(
                    &transport,
                    &options,
                    probe(&transport, &ids, &options).await,
                )
                .await?
            }
        };
        let profile = match (probe, options.era) {
            (Probe::Modern { version, discover }, _) => ServerProfile::Modern { version, discover },
            (Probe::Refused(_, Some(error)), EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                tracing::warn!(server, error = %crate::util::text::one_line(&error.to_string(), 200), "a server configured as modern answered server/discover with an error; its start is tried again (a legacy server needs era auto or legacy)");
                // Not shown to be legacy (an internal error, a backend not ready):
                // started again with backoff, as any failed start.
                return Err(ConnectError::Refused {
                    method: "server/discover",
                    error,
                });
            }
            (Probe::Legacy(reason) | Probe::Refused(reason, None), EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                // It may quote the server (an error, a content type): kept short.
                return Err(ConnectError::NotModern(crate::util::text::one_line(
                    &reason, 300,
                )));
            }
            (Probe::Silent(waited), EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                // Slow, not shown to be legacy: tried again (with backoff) on restart.
                return Err(ConnectError::Transport(TransportError::Timeout(waited)));
            }
            (Probe::Exited(e), EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                tracing::warn!(server, error = %e, "a server configured as modern exited on server/discover; its start is tried again (a legacy server needs era auto or legacy)");
                // A crash says nothing of the era: started again with backoff.
                return Err(ConnectError::Transport(e));
            }
            (Probe::Legacy(reason), _) => {
                tracing::debug!(server, %reason, "using the legacy handshake");
                let handshake =
                    legacy_handshake(&transport, &mut inbound, &mut held, &ids, &options);
                ServerProfile::Legacy(handshake.await?)
            }
            // Refused, or unanswered in time (a slow start, perhaps).
            (found @ (Probe::Refused(..) | Probe::Silent(_)), _) => {
                let silent = matches!(found, Probe::Silent(_));
                let reason = match found {
                    Probe::Refused(reason, _) => reason,
                    _ => "no answer to server/discover".into(),
                };
                tracing::debug!(server, %reason, "using the legacy handshake");
                let handshake =
                    initialize_answering_pings(&transport, &mut inbound, &mut held, &ids, &options)
                        .await;
                // Shown to be modern: a failure of the probe again is not one to meet
                // with a legacy handshake.
                let mut modern = false;
                let handshake = match handshake {
                    // A modern server slow to start: it read the probe once up (its
                    // answer came after the wait) and refuses `initialize` naming its
                    // versions. Probed again now that it runs; each restart would be
                    // as slow (spec section H: a -32022 names a modern server).
                    Err(ConnectError::Refused {
                        method: "initialize",
                        error,
                    }) if silent && error.is_modern() => {
                        tracing::info!(
                            server,
                            "a server slow to answer server/discover refused initialize as a modern server does; probing it again"
                        );
                        modern = true;
                        match self::probe::probe(&transport, &ids, &options).await {
                            Ok(Probe::Modern { version, discover }) => {
                                Ok(ServerProfile::Modern { version, discover })
                            }
                            Ok(_) => Err(ConnectError::Refused {
                                method: "initialize",
                                error,
                            }),
                            Err(e) => Err(e),
                        }
                    }
                    other => other.map(ServerProfile::Legacy),
                };
                if handshake.is_err() {
                    transport.shutdown(options.shutdown_grace).await;
                }
                match handshake {
                    // It read server/discover and exited (a server that takes nothing
                    // before `initialize`): as one that exited on it, respawned once.
                    Err(ConnectError::Transport(
                        TransportError::Closed { .. } | TransportError::NotSent(_),
                    )) if !transport.is_http() && !modern => {
                        tracing::info!(
                            server,
                            %reason,
                            "server exited after server/discover; respawning for the legacy handshake"
                        );
                        transport.shutdown(options.shutdown_grace).await;
                        held.clear();
                        (transport, inbound) = open(server, &spec, &options, &ids).await?;
                        let handshake =
                            legacy_handshake(&transport, &mut inbound, &mut held, &ids, &options);
                        ServerProfile::Legacy(handshake.await?)
                    }
                    handshake => handshake?,
                }
            }
            (Probe::Exited(_), _) => {
                tracing::info!(
                    server,
                    "server exited on server/discover; respawning for the legacy handshake"
                );
                transport.shutdown(options.shutdown_grace).await;
                (transport, inbound) = open(server, &spec, &options, &ids).await?;
                let handshake =
                    legacy_handshake(&transport, &mut inbound, &mut held, &ids, &options);
                ServerProfile::Legacy(handshake.await?)
            }
        };
        let envelope = envelope(&options, profile.protocol_version());
        let (events_tx, events_rx) = mpsc::channel(options.event_capacity.max(1));
        let calls_in_flight = Arc::new(AtomicUsize::new(0));
        let subscriptions = listen::Subscriptions::default();
        let owners = dispatch::Owners::default();
        let dispatch = Dispatch {
            subscriptions: subscriptions.clone(),
            owners: owners.clone(),
            server: server.to_string(),
            transport: Arc::downgrade(&transport),
            events: events_tx,
            era: profile.era(),
            timeout: options.request_timeout,
            calls_in_flight: calls_in_flight.clone(),
            answering: Arc::new(Semaphore::new(MAX_SERVER_REQUESTS)),
            being_answered: Default::default(),
            replying: Arc::new(Semaphore::new(dispatch::MAX_REPLIES)),
            congested: Default::default(),
            allow_unsolicited_input,
            refused: Default::default(),
        };
        let dispatcher = tokio::spawn(dispatch.run(held, inbound));
        tracing::info!(
            server,
            era = profile.era().as_str(),
            version = profile.protocol_version(),
            "server connected"
        );
        let connection = Connection {
            server: server.to_string(),
            transport,
            options,
            profile,
            envelope: RwLock::new(Arc::new(envelope)),
            ids,
            in_flight: AtomicUsize::new(0),
            calls_in_flight,
            subscriptions,
            owners,
            dispatcher,
            silent: tokio::sync::Notify::new(),
            long_in_flight: AtomicUsize::new(0),
            announced: std::sync::atomic::AtomicU8::new(0),
        };
        Ok((connection, events_rx))
    }

    /// The server's name, as given to [`Connection::connect`].
    pub fn server(&self) -> &str {
        &self.server
    }

    /// What the server said about itself.
    pub fn profile(&self) -> &ServerProfile {
        &self.profile
    }

    /// The client capabilities this connection was opened with: what a legacy server
    /// was told at `initialize` and holds for the connection's life.
    pub fn declared(&self) -> &serde_json::Value {
        &self.options.capabilities
    }

    /// The era the server speaks.
    pub fn era(&self) -> Era {
        self.profile.era()
    }

    /// Whether [`Connection::protocol_version`] is `version`, without allocating.
    pub fn protocol_version_is(&self, version: &str) -> bool {
        match self.profile.era() {
            Era::Modern => self.envelope.read().protocol_version() == version,
            Era::Legacy => self.profile.protocol_version() == version,
        }
    }

    /// The protocol version every request names now (it changes after a -32022).
    pub fn protocol_version(&self) -> String {
        match self.profile.era() {
            Era::Modern => self.envelope.read().protocol_version().to_string(),
            Era::Legacy => self.profile.protocol_version().to_string(),
        }
    }

    /// Whether the server is reached over HTTP.
    pub fn is_http(&self) -> bool {
        self.transport.is_http()
    }

    /// Whether `identity` (an auth context; `None`: the connection's own) holds a token
    /// for this server.
    pub fn signed_in(&self, identity: Option<&str>) -> bool {
        self.transport.signed_in(identity)
    }

    /// Signs `identity` in now, whether or not the server asked yet (an embedder
    /// signing a user in ahead of their first call). Stdio servers have no sign-in.
    pub async fn sign_in(&self, identity: Option<&str>) -> Result<(), TransportError> {
        self.transport.sign_in(identity).await
    }

    /// Forgets every token of this server; how many there were.
    pub fn sign_out(&self) -> Result<usize, TransportError> {
        self.transport.sign_out()
    }

    /// The stdio server's pid (and process group), if this is a stdio connection.
    pub fn pid(&self) -> Option<u32> {
        self.transport.pid()
    }

    /// The end of a stdio server's process (none over HTTP).
    pub fn process_exit(&self) -> Option<crate::transport::ProcessExit> {
        self.transport.process_exit()
    }

    /// Whether a stdio connection's transport has ended (HTTP has no standing link).
    pub fn is_closed(&self) -> bool {
        self.transport.is_closed()
    }

    /// Requests in flight on this connection now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// SIGKILLs a stdio server's process group (fault injection); no-op on HTTP.
    pub fn kill(&self) {
        self.transport.kill();
    }

    /// How many lines a stdio server has written so far (`None` over HTTP).
    pub fn heard(&self) -> Option<u64> {
        self.transport.heard()
    }

    /// Returns once a request on this stdio connection has timed out with not a line
    /// heard from the server while it waited: a server wedged (deadlocked, stopped),
    /// not one slow at a tool, which still answers others. The owner may probe it.
    pub async fn timed_out_silently(&self) {
        self.silent.notified().await;
    }

    /// Whether a request given longer than the connection's own timeout (an embedder's
    /// own deadline) may still be waiting: a server silent meanwhile may be at work on
    /// it, not wedged.
    pub fn waits_long(&self) -> bool {
        self.long_in_flight.load(Ordering::SeqCst) > 0
    }

    /// Says which lists' changes an acknowledged subscription on this connection
    /// announces now (`lists[i]` for [`LISTED_CAPABILITIES`]`[i]`; all false once it
    /// ends): a list without freshness hints may be kept only while its changes are.
    pub(crate) fn set_announced(&self, lists: [bool; 3]) {
        let bits = lists
            .iter()
            .enumerate()
            .fold(0u8, |bits, (i, on)| bits | (u8::from(*on) << i));
        self.announced.store(bits, Ordering::SeqCst);
    }

    /// Whether an acknowledged subscription on this connection announces changes of
    /// the list of `capability` (`tools`, `prompts`, `resources`) now.
    pub(crate) fn announces(&self, capability: &str) -> bool {
        LISTED_CAPABILITIES
            .iter()
            .position(|c| *c == capability)
            .is_some_and(|i| self.announced.load(Ordering::SeqCst) & (1 << i) != 0)
    }

    /// Sends one request with the default deadline.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RequestError> {
        let timeout = self.options.request_timeout;
        self.request_as(method, params.as_ref(), timeout, RequestOptions::default())
            .await
    }

    /// Sends one request and returns its result within `timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the request on the server.
    pub async fn request_with_timeout(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, RequestError> {
        self.request_as(method, params.as_ref(), timeout, RequestOptions::default())
            .await
    }

    /// Sends one request and returns its result within `timeout`, declaring
    /// `capabilities` for this one request (modern servers; legacy servers took theirs
    /// at `initialize`), or the connection's own when `None`.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the request on the server.
    pub async fn request_with(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        capabilities: Option<&Value>,
    ) -> Result<Value, RequestError> {
        let options = RequestOptions {
            capabilities,
            ..RequestOptions::default()
        };
        self.request_as(method, params.as_ref(), timeout, options)
            .await
    }

    /// [`Connection::request_with`], as the options say: an HTTP server that needs
    /// sign-in gets the token of their `identity`, and a legacy HTTP server's requests
    /// during this one are said to be their `owner`'s. The params are borrowed: they
    /// are written as they are, never copied.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the request on the server.
    pub async fn request_as(
        &self,
        method: &str,
        params: Option<&Value>,
        timeout: Duration,
        options: RequestOptions<'_>,
    ) -> Result<Value, RequestError> {
        let RequestOptions {
            capabilities,
            identity,
            owner,
        } = options;
        // The clock is read again only for a second try (a renegotiation): the first
        // gets the whole timeout, as good as read at once.
        let started = Instant::now();
        let mut first = true;
        let mut remaining = || {
            if std::mem::take(&mut first) {
                timeout
            } else {
                timeout.saturating_sub(started.elapsed())
            }
        };
        let is_call = CALL_METHODS.contains(&method);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if is_call {
            self.calls_in_flight.fetch_add(1, Ordering::SeqCst);
        }
        let _counted = Counted {
            all: &self.in_flight,
            calls: is_call.then_some(&*self.calls_in_flight),
        };
        let heard = self.transport.heard();
        // Given longer than the connection's own timeout: counted while it waits.
        let _long = (timeout > self.options.request_timeout).then(|| {
            self.long_in_flight.fetch_add(1, Ordering::SeqCst);
            Counted {
                all: &self.long_in_flight,
                calls: None,
            }
        });
        // Modern requests carry the envelope, merged into `_meta` as they are written.
        let envelope = |c: &Connection| (c.era() == Era::Modern).then(|| c.envelope.read().clone());
        let mut current = envelope(self);
        let mut id = self.ids.next();
        // Only a legacy HTTP server's requests come on a request's own stream.
        let _owned = (self.era() == Era::Legacy && self.is_http()).then(|| {
            self.owners.lock().insert(id.clone(), owner);
            Owned {
                owners: &self.owners,
                id: id.clone(),
            }
        });
        let mut renegotiated = false;
        let mut sent = SentId {
            span: tracing::Span::current(),
            id: id.clone(),
        };
        loop {
            sent.id = id.clone();
            let request = RequestRef {
                id: &id,
                method,
                params,
            };
            let stamp = current.as_deref().map(|envelope| Stamp {
                envelope,
                capabilities,
            });
            match self
                .transport
                .request(request, stamp, remaining(), identity, &mut sent.id)
                .await
            {
                Ok(Ok(result)) => return Ok(result),
                Ok(Err(error)) if !renegotiated && self.renegotiate(&error) => {
                    // No time left for the second try: the deadline's error, not a
                    // request given up at once for a wait of nothing.
                    if timeout.saturating_sub(started.elapsed()).is_zero() {
                        return Err(RequestError::Transport(TransportError::Timeout(timeout)));
                    }
                    renegotiated = true;
                    current = envelope(self);
                    id = self.ids.next();
                }
                Ok(Err(error)) => return Err(RequestError::Rpc(error)),
                // The deadline the caller set, not what was left of it at the last step.
                Err(TransportError::Timeout(_)) => {
                    if heard.is_some() && self.transport.heard() == heard {
                        self.silent.notify_one();
                    }
                    return Err(RequestError::Transport(TransportError::Timeout(timeout)));
                }
                Err(e) => return Err(RequestError::Transport(e)),
            }
        }
    }

    /// After a -32022 from a modern server: switches to a version both speak (which may
    /// be the one just sent) and says whether to retry.
    fn renegotiate(&self, error: &RpcError) -> bool {
        let RpcErrorKind::UnsupportedProtocolVersion { supported, .. } = error.kind() else {
            return false;
        };
        if self.era() != Era::Modern {
            return false;
        }
        let Some(version) = pick_version(&self.options.preferred_versions, &supported) else {
            return false;
        };
        let mut envelope = self.envelope.write();
        if envelope.protocol_version() != version {
            tracing::info!(server = %self.server, %version, "server changed versions; renegotiated");
            *envelope = Arc::new(envelope.with_protocol_version(version));
        }
        true
    }

    /// Sends a notification (stdio, and legacy HTTP; modern HTTP has none).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), TransportError> {
        if self.era() == Era::Modern && self.is_http() {
            return Ok(());
        }
        let notification = Notification {
            method: method.to_string(),
            params,
        };
        self.transport
            .notify(notification, self.options.request_timeout)
            .await
    }

    /// Stops the server: for stdio, close stdin, wait, SIGTERM the group, wait,
    /// SIGKILL, reap; for legacy HTTP, DELETE the session.
    pub async fn shutdown(&self) {
        self.dispatcher.abort();
        self.transport.shutdown(self.options.shutdown_grace).await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.dispatcher.abort();
        // The legacy GET stream's task holds the HTTP transport: end it with us.
        self.transport.detach();
        // The dispatcher holds only a weak reference, so the transport (and a stdio
        // process group's kill guard) drops with this connection.
    }
}
