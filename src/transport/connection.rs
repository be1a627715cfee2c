//! One connection to one MCP server: era detection, the `_meta` envelope, and the
//! server's own traffic.
//!
//! [`Connection::connect`] opens the transport and identifies the server (spec section
//! H): it probes with `server/discover`. A discover result sharing a version with us,
//! or a -32022 naming one, means modern (re-probing at that version). -32020/-32021
//! mean modern and are errors. Anything else (another error, no answer within the probe
//! timeout, a 4xx, a reply that is not JSON-RPC) means legacy: `initialize`, wait for
//! its reply, `notifications/initialized`. A stdio server that exits on the probe is
//! respawned and goes straight to `initialize`.
//!
//! Every request to a modern server carries the full `_meta` envelope. Legacy servers
//! get plain legacy requests: they took our capabilities at `initialize`, and dual-era
//! servers (rmcp 3.11 among them) treat a request carrying the modern envelope as a
//! stateless modern request, outside the legacy session.
//!
//! Server-to-client traffic goes up as [`ServerEvent`]s on a bounded channel that the
//! caller drains: requests of legacy servers (`elicitation/create`,
//! `sampling/createMessage`, `roots/list`) with a reply handle, notifications
//! (`tools/list_changed`, progress), and the transport's end. `ping` is answered here.
//! A modern server that sends a request breaks the protocol: it gets an error and the
//! connection stays up. The dispatcher never blocks on the caller: when the channel is
//! full, a request is refused and a notification dropped, with a warning.
//!
//! Dropping a [`Connection`] kills a stdio server's process group at once;
//! [`Connection::shutdown`] stops it gracefully.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::error::{ConnectError, RequestError, TransportError};
use super::http::HttpTransport;
use super::http::headers::{ParamHeader, param_headers, param_value};
use super::stdio::StdioTransport;
use super::{Inbound, Transport, TransportSpec};
use crate::protocol::error::{INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::protocol::meta::{LEGACY_2025_11_25, LEGACY_VERSIONS, MODERN, is_modern_version};
use crate::protocol::views::InitializeResult;
use crate::protocol::{
    DiscoverResult, Implementation, MetaEnvelope, Notification, Request, RequestId, RpcError,
    RpcErrorKind,
};

/// Which era to speak with a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EraPreference {
    /// Probe with `server/discover`, fall back to `initialize` (the default).
    #[default]
    Auto,
    /// Modern only: a server that does not answer discover is an error.
    Modern,
    /// Skip the probe and run the legacy handshake.
    Legacy,
}

/// The era a connected server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Era {
    /// 2026-07-28 or later: stateless, `_meta` on every request, MRTR.
    Modern,
    /// 2025-06-18 or 2025-11-25: `initialize` handshake, server-to-client requests.
    Legacy,
}

/// What the server said about itself when it connected.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerProfile {
    /// The `server/discover` result, and the version chosen from it.
    Modern {
        /// The version every request now names.
        version: String,
        /// The discover result.
        discover: DiscoverResult,
    },
    /// The `initialize` result.
    Legacy(InitializeResult),
}

impl ServerProfile {
    /// The protocol version in use.
    pub fn protocol_version(&self) -> &str {
        match self {
            ServerProfile::Modern { version, .. } => version,
            ServerProfile::Legacy(init) => &init.protocol_version,
        }
    }

    /// The server's capabilities object.
    pub fn capabilities(&self) -> &Value {
        match self {
            ServerProfile::Modern { discover, .. } => &discover.capabilities,
            ServerProfile::Legacy(init) => &init.capabilities,
        }
    }

    /// The server's instructions for the model, if any.
    pub fn instructions(&self) -> Option<&str> {
        match self {
            ServerProfile::Modern { discover, .. } => discover.instructions.as_deref(),
            ServerProfile::Legacy(init) => init.instructions.as_deref(),
        }
    }

    /// The server's self-reported identity.
    pub fn server_info(&self) -> Option<&Value> {
        match self {
            ServerProfile::Modern { discover, .. } => discover.server_info.as_ref(),
            ServerProfile::Legacy(init) => init.server_info.as_ref(),
        }
    }

    /// The era.
    pub fn era(&self) -> Era {
        match self {
            ServerProfile::Modern { .. } => Era::Modern,
            ServerProfile::Legacy(_) => Era::Legacy,
        }
    }
}

/// How to connect, and what to tell the server about ourselves.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Sent as `clientInfo`.
    pub client_info: Implementation,
    /// The client capabilities to declare (`{}` for none); built by the layer above
    /// from the input handlers it has.
    pub capabilities: Value,
    /// Modern versions to offer, most preferred first.
    pub preferred_versions: Vec<String>,
    /// Which era to speak.
    pub era: EraPreference,
    /// How long to wait for the discover probe before assuming legacy.
    pub probe_timeout: Duration,
    /// Default deadline of one request.
    pub request_timeout: Duration,
    /// Largest stdio line or HTTP reply accepted.
    pub max_message_bytes: usize,
    /// How long a stdio server gets after stdin EOF, and again after SIGTERM.
    pub shutdown_grace: Duration,
    /// Capacity of the [`ServerEvent`] channel.
    pub event_capacity: usize,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            client_info: Implementation::harness(),
            capabilities: json!({}),
            preferred_versions: vec![MODERN.to_string()],
            era: EraPreference::Auto,
            probe_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            max_message_bytes: 16 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(3),
            event_capacity: 256,
        }
    }
}

/// Traffic from the server that is not a reply to our requests.
#[derive(Debug)]
pub enum ServerEvent {
    /// A legacy server asks the client something; answer with [`ServerRequest::respond`].
    Request(ServerRequest),
    /// A notification (`notifications/tools/list_changed`, progress, log messages).
    Notification(Notification),
    /// The transport ended; the connection is dead.
    Closed(TransportError),
}

/// A request from a legacy server, waiting for the client's answer.
#[derive(Debug)]
pub struct ServerRequest {
    /// For example `elicitation/create`.
    pub method: String,
    /// The request's params, as sent.
    pub params: Value,
    reply: oneshot::Sender<Result<Value, RpcError>>,
}

impl ServerRequest {
    /// Sends the answer back to the server. Dropping the request unanswered sends an
    /// internal error instead.
    pub fn respond(self, outcome: Result<Value, RpcError>) {
        let _ = self.reply.send(outcome);
    }
}

/// A connected, identified MCP server.
pub struct Connection {
    server: String,
    transport: Arc<Transport>,
    options: ConnectOptions,
    profile: ServerProfile,
    envelope: RwLock<MetaEnvelope>,
    next_id: AtomicI64,
    /// `x-mcp-header` annotations per tool, from the last `tools/list` (HTTP only).
    param_headers: RwLock<HashMap<String, Vec<ParamHeader>>>,
    /// Whether this connection has read the tool list (HTTP: for the header table).
    tools_listed: AtomicBool,
    /// Renewals of a legacy HTTP session, one at a time.
    reinit: tokio::sync::Mutex<()>,
    /// Bumped by every renewal.
    session_generation: AtomicU64,
    dispatcher: JoinHandle<()>,
}

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

/// The outcome of the discover probe.
enum Probe {
    Modern {
        version: String,
        discover: DiscoverResult,
    },
    Legacy(String),
    /// The stdio process died on the probe: respawn, then `initialize`.
    Exited,
}

fn open(
    server: &str,
    spec: &TransportSpec,
    options: &ConnectOptions,
) -> Result<(Arc<Transport>, mpsc::Receiver<Inbound>), TransportError> {
    let (tx, rx) = mpsc::channel(options.event_capacity);
    let transport = match spec {
        TransportSpec::Stdio(s) => Transport::Stdio(StdioTransport::spawn(
            server,
            s,
            options.max_message_bytes,
            tx,
        )?),
        TransportSpec::Http(h) => Transport::Http(Arc::new(HttpTransport::new(
            server,
            h,
            options.max_message_bytes,
            tx,
        )?)),
    };
    Ok((Arc::new(transport), rx))
}

fn envelope(options: &ConnectOptions, version: &str) -> MetaEnvelope {
    MetaEnvelope {
        protocol_version: version.to_string(),
        client_capabilities: options.capabilities.clone(),
        client_info: serde_json::to_value(&options.client_info).unwrap_or(Value::Null),
    }
}

/// The first of our preferred versions the server supports.
fn pick_version(preferred: &[String], supported: &[String]) -> Option<String> {
    preferred.iter().find(|v| supported.contains(v)).cloned()
}

impl Connection {
    /// Opens the transport and identifies the server. Returns the connection and the
    /// channel of [`ServerEvent`]s, which the caller must drain (or drop).
    pub async fn connect(
        server: &str,
        spec: TransportSpec,
        options: ConnectOptions,
    ) -> Result<(Connection, mpsc::Receiver<ServerEvent>), ConnectError> {
        let next_id = AtomicI64::new(1);
        let (mut transport, mut inbound) = open(server, &spec, &options)?;
        let probe = match options.era {
            EraPreference::Legacy => Probe::Legacy("configured as legacy".into()),
            EraPreference::Auto | EraPreference::Modern => {
                probe(&transport, &next_id, &options).await?
            }
        };
        let profile = match (probe, options.era) {
            (Probe::Modern { version, discover }, _) => ServerProfile::Modern { version, discover },
            (Probe::Legacy(reason), EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                return Err(ConnectError::NotModern(reason));
            }
            (Probe::Exited, EraPreference::Modern) => {
                transport.shutdown(options.shutdown_grace).await;
                return Err(ConnectError::NotModern(
                    "the server exited on server/discover".into(),
                ));
            }
            (Probe::Legacy(reason), _) => {
                tracing::debug!(server, %reason, "using the legacy handshake");
                ServerProfile::Legacy(initialize(&transport, &next_id, &options).await?)
            }
            (Probe::Exited, _) => {
                tracing::info!(
                    server,
                    "server exited on server/discover; respawning for the legacy handshake"
                );
                transport.shutdown(options.shutdown_grace).await;
                (transport, inbound) = open(server, &spec, &options)?;
                ServerProfile::Legacy(initialize(&transport, &next_id, &options).await?)
            }
        };
        let envelope = envelope(&options, profile.protocol_version());
        let (events_tx, events_rx) = mpsc::channel(options.event_capacity);
        let dispatcher = tokio::spawn(dispatch(
            server.to_string(),
            Arc::downgrade(&transport),
            inbound,
            events_tx,
            profile.era(),
            options.request_timeout,
        ));
        tracing::info!(server, era = ?profile.era(), version = profile.protocol_version(), "server connected");
        let connection = Connection {
            server: server.to_string(),
            transport,
            options,
            profile,
            envelope: RwLock::new(envelope),
            next_id,
            param_headers: RwLock::new(HashMap::new()),
            tools_listed: AtomicBool::new(false),
            reinit: tokio::sync::Mutex::new(()),
            session_generation: AtomicU64::new(0),
            dispatcher,
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

    /// The era the server speaks.
    pub fn era(&self) -> Era {
        self.profile.era()
    }

    /// The protocol version every request names now (it changes after a -32022).
    pub fn protocol_version(&self) -> String {
        match self.profile.era() {
            Era::Modern => self.envelope.read().protocol_version.clone(),
            Era::Legacy => self.profile.protocol_version().to_string(),
        }
    }

    /// The stdio server's pid (and process group), if this is a stdio connection.
    pub fn pid(&self) -> Option<u32> {
        match &*self.transport {
            Transport::Stdio(t) => Some(t.pid()),
            Transport::Http(_) => None,
        }
    }

    /// Whether a stdio connection's transport has ended (HTTP has no standing link).
    pub fn is_closed(&self) -> bool {
        match &*self.transport {
            Transport::Stdio(t) => t.is_closed(),
            Transport::Http(_) => false,
        }
    }

    /// SIGKILLs a stdio server's process group (fault injection); no-op on HTTP.
    pub fn kill(&self) {
        if let Transport::Stdio(t) = &*self.transport {
            t.kill();
        }
    }

    /// Sends one request with the default deadline.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RequestError> {
        self.request_with_timeout(method, params, self.options.request_timeout)
            .await
    }

    /// Sends one request and returns its result. Modern requests carry the `_meta`
    /// envelope; a -32022 re-picks a version from `data.supported` and retries once, and
    /// an expired legacy HTTP session is re-initialized and the request retried once.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the request on the server.
    pub async fn request_with_timeout(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, RequestError> {
        self.request_with(method, params, timeout, None).await
    }

    /// [`Connection::request_with_timeout`], declaring `capabilities` for this one
    /// request (modern servers; legacy servers took theirs at `initialize`).
    pub async fn request_with(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        capabilities: Option<&Value>,
    ) -> Result<Value, RequestError> {
        // One deadline for the whole request, retries and re-initialization included.
        let deadline = Instant::now().checked_add(timeout);
        let remaining =
            || deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
        let is_http = matches!(&*self.transport, Transport::Http(_));
        if is_http && method == "tools/call" && !self.tools_listed.load(Ordering::Relaxed) {
            self.learn_param_headers(remaining()).await;
        }
        let mut extra = self.header_params(method, params.as_ref());
        let params = match self.era() {
            Era::Modern => Some(self.envelope.read().stamp_with(params, capabilities)),
            Era::Legacy => params,
        };
        let mut request = Request {
            id: self.new_id(),
            method: method.to_string(),
            params,
        };
        let session = self.session_generation.load(Ordering::SeqCst);
        let mut retried = false;
        loop {
            match self.transport.request(&request, &extra, remaining()).await {
                Ok(Ok(result)) => return Ok(self.after_result(method, result)),
                Ok(Err(error)) if !retried => {
                    if let Some(version) = self.renegotiate(&error) {
                        tracing::info!(server = %self.server, %version, "server changed versions; renegotiated");
                        request.params = Some(
                            self.envelope
                                .read()
                                .stamp_with(request.params.take(), capabilities),
                        );
                    } else if is_http
                        && method == "tools/call"
                        && error.kind() == RpcErrorKind::HeaderMismatch
                    {
                        // The tool's x-mcp-header annotations may have changed: re-learn them.
                        self.learn_param_headers(remaining()).await;
                        let original = request.params.as_ref();
                        extra = self.header_params(method, original);
                    } else {
                        return Err(RequestError::Rpc(error));
                    }
                    request.id = self.new_id();
                    retried = true;
                }
                Ok(Err(error)) => return Err(RequestError::Rpc(error)),
                Err(TransportError::SessionExpired) if !retried => {
                    self.reinitialize(session, remaining()).await?;
                    request.id = self.new_id();
                    retried = true;
                }
                // The deadline the caller set, not what was left of it at the last step.
                Err(TransportError::Timeout(_)) => {
                    return Err(RequestError::Transport(TransportError::Timeout(timeout)));
                }
                Err(e) => return Err(RequestError::Transport(e)),
            }
        }
    }

    /// Renews an expired legacy HTTP session, once for all the requests that saw it
    /// expire: a request whose session was already renewed just retries.
    async fn reinitialize(&self, seen: u64, timeout: Duration) -> Result<(), RequestError> {
        let _one_at_a_time = self.reinit.lock().await;
        if self.session_generation.load(Ordering::SeqCst) != seen {
            return Ok(());
        }
        tracing::info!(server = %self.server, "HTTP session expired; initializing again");
        if let Transport::Http(t) = &*self.transport {
            t.clear_session();
        }
        let options = ConnectOptions {
            request_timeout: timeout.min(self.options.request_timeout),
            ..self.options.clone()
        };
        initialize(&self.transport, &self.next_id, &options)
            .await
            .map_err(|e| RequestError::Transport(TransportError::NotSent(e.to_string())))?;
        self.session_generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Reads this server's tool list over this connection (every page) so that
    /// `tools/call` can carry the `Mcp-Param-*` headers its schemas ask for; the harness's
    /// cache may have served the list without this connection ever seeing it.
    async fn learn_param_headers(&self, timeout: Duration) {
        self.tools_listed.store(true, Ordering::Relaxed);
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let params = cursor.as_ref().map(|c| json!({ "cursor": c }));
            let params = match self.era() {
                Era::Modern => Some(self.envelope.read().stamp(params)),
                Era::Legacy => params,
            };
            let request = Request {
                id: self.new_id(),
                method: "tools/list".into(),
                params,
            };
            let Ok(Ok(page)) = self.transport.request(&request, &[], timeout).await else {
                return;
            };
            let page = self.after_result("tools/list", page);
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if seen.insert(next.to_string()) => cursor = Some(next.to_string()),
                _ => return,
            }
        }
    }

    fn new_id(&self) -> RequestId {
        RequestId::Number(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// After a -32022 from a modern server, switches to a version it supports.
    fn renegotiate(&self, error: &RpcError) -> Option<String> {
        let RpcErrorKind::UnsupportedProtocolVersion { supported, .. } = error.kind() else {
            return None;
        };
        if self.era() != Era::Modern {
            return None;
        }
        let version = pick_version(&self.options.preferred_versions, &supported)?;
        let mut envelope = self.envelope.write();
        if envelope.protocol_version == version {
            return None;
        }
        envelope.protocol_version = version.clone();
        Some(version)
    }

    /// `Mcp-Param-*` headers for a `tools/call` over HTTP, from the tool's schema.
    fn header_params(
        &self,
        method: &str,
        params: Option<&Value>,
    ) -> Vec<(HeaderName, HeaderValue)> {
        if method != "tools/call" || !matches!(&*self.transport, Transport::Http(_)) {
            return Vec::new();
        }
        let Some(params) = params else {
            return Vec::new();
        };
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Vec::new();
        };
        let table = self.param_headers.read();
        let Some(annotations) = table.get(name) else {
            return Vec::new();
        };
        let arguments = params.get("arguments").unwrap_or(&Value::Null);
        annotations
            .iter()
            .filter_map(|h| {
                let value = param_value(arguments, &h.path)?;
                Some((
                    HeaderName::from_bytes(format!("mcp-param-{}", h.name).as_bytes()).ok()?,
                    HeaderValue::from_str(&value).ok()?,
                ))
            })
            .collect()
    }

    /// On HTTP, drops tools with invalid `x-mcp-header` annotations from a `tools/list`
    /// page and remembers the valid ones.
    fn after_result(&self, method: &str, mut result: Value) -> Value {
        if method != "tools/list" || !matches!(&*self.transport, Transport::Http(_)) {
            return result;
        }
        self.tools_listed.store(true, Ordering::Relaxed);
        let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
            return result;
        };
        let mut table = self.param_headers.write();
        tools.retain(|tool| {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
            match param_headers(schema) {
                Ok(found) => {
                    if found.is_empty() {
                        table.remove(name);
                    } else {
                        table.insert(name.to_string(), found);
                    }
                    true
                }
                Err(reason) => {
                    tracing::warn!(server = %self.server, tool = name, %reason, "dropping tool with invalid x-mcp-header");
                    table.remove(name);
                    false
                }
            }
        });
        result
    }

    /// Sends a notification (stdio, and legacy HTTP; modern HTTP has none).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), TransportError> {
        if self.era() == Era::Modern && matches!(&*self.transport, Transport::Http(_)) {
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
        if let Transport::Http(t) = &*self.transport {
            t.stop_get_stream();
        }
        // The dispatcher holds only a weak reference, so the transport (and a stdio
        // process group's kill guard) drops with this connection.
    }
}

async fn send(
    transport: &Transport,
    next_id: &AtomicI64,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Result<Value, RpcError>, TransportError> {
    let request = Request {
        id: RequestId::Number(next_id.fetch_add(1, Ordering::Relaxed)),
        method: method.to_string(),
        params: Some(params),
    };
    transport.request(&request, &[], timeout).await
}

async fn probe(
    transport: &Transport,
    next_id: &AtomicI64,
    options: &ConnectOptions,
) -> Result<Probe, ConnectError> {
    let is_stdio = matches!(transport, Transport::Stdio(_));
    let Some(mut version) = options.preferred_versions.first().cloned() else {
        return Ok(Probe::Legacy("no modern version offered".into()));
    };
    let mut tried = vec![];
    loop {
        tried.push(version.clone());
        let params = envelope(options, &version).stamp(None);
        match send(
            transport,
            next_id,
            "server/discover",
            params,
            options.probe_timeout,
        )
        .await
        {
            Ok(Ok(result)) => {
                let discover = match DiscoverResult::from_value(&result) {
                    Ok(d) => d,
                    Err(e) => return Ok(Probe::Legacy(format!("discover result unreadable: {e}"))),
                };
                return match pick_version(&options.preferred_versions, &discover.supported_versions)
                {
                    Some(version) => Ok(Probe::Modern { version, discover }),
                    None if discover
                        .supported_versions
                        .iter()
                        .any(|v| is_modern_version(v)) =>
                    {
                        Err(ConnectError::NoCommonVersion {
                            server: discover.supported_versions,
                            client: options.preferred_versions.clone(),
                        })
                    }
                    None => Ok(Probe::Legacy("discover lists only legacy versions".into())),
                };
            }
            Ok(Err(error)) => match error.kind() {
                RpcErrorKind::UnsupportedProtocolVersion { supported, .. }
                    if !supported.is_empty() =>
                {
                    let next = options
                        .preferred_versions
                        .iter()
                        .find(|v| supported.contains(v) && !tried.contains(v));
                    match next {
                        Some(v) => version = v.clone(),
                        None if supported.iter().any(|v| is_modern_version(v)) => {
                            return Err(ConnectError::NoCommonVersion {
                                server: supported,
                                client: options.preferred_versions.clone(),
                            });
                        }
                        None => {
                            return Ok(Probe::Legacy(
                                "server supports only legacy versions".into(),
                            ));
                        }
                    }
                }
                _ if error.is_modern() => {
                    return Err(ConnectError::Refused {
                        method: "server/discover",
                        error,
                    });
                }
                _ => return Ok(Probe::Legacy(format!("discover answered with {error}"))),
            },
            Err(TransportError::Timeout(_)) => {
                return Ok(Probe::Legacy("no answer to server/discover".into()));
            }
            Err(TransportError::Closed { .. } | TransportError::NotSent(_)) if is_stdio => {
                return Ok(Probe::Exited);
            }
            Err(TransportError::HttpStatus { status, .. }) if (400..500).contains(&status) => {
                return Ok(Probe::Legacy(format!("discover answered HTTP {status}")));
            }
            Err(TransportError::Protocol(e)) => {
                return Ok(Probe::Legacy(format!("discover reply unreadable: {e}")));
            }
            Err(TransportError::UnexpectedContentType(t)) => {
                return Ok(Probe::Legacy(format!(
                    "discover answered with content type {t:?}"
                )));
            }
            Err(e) => return Err(ConnectError::Transport(e)),
        }
    }
}

async fn initialize(
    transport: &Transport,
    next_id: &AtomicI64,
    options: &ConnectOptions,
) -> Result<InitializeResult, ConnectError> {
    let params = json!({
        "protocolVersion": LEGACY_2025_11_25,
        "capabilities": options.capabilities,
        "clientInfo": options.client_info,
    });
    let result = match send(
        transport,
        next_id,
        "initialize",
        params,
        options.request_timeout,
    )
    .await?
    {
        Ok(result) => InitializeResult::from_value(&result)?,
        Err(error) => {
            return Err(ConnectError::Refused {
                method: "initialize",
                error,
            });
        }
    };
    if !LEGACY_VERSIONS.contains(&result.protocol_version.as_str()) {
        return Err(ConnectError::UnsupportedLegacyVersion(
            result.protocol_version,
        ));
    }
    if let Transport::Http(t) = transport {
        t.set_legacy_version(&result.protocol_version);
    }
    let initialized = Notification {
        method: "notifications/initialized".into(),
        params: None,
    };
    transport
        .notify(initialized, options.request_timeout)
        .await?;
    if let Transport::Http(t) = transport {
        t.open_get_stream();
    }
    Ok(result)
}

/// Routes what the server sends on its own: answers `ping`, refuses requests from
/// modern servers, and hands the rest up without ever blocking on the caller.
async fn dispatch(
    server: String,
    transport: Weak<Transport>,
    mut inbound: mpsc::Receiver<Inbound>,
    events: mpsc::Sender<ServerEvent>,
    era: Era,
    timeout: Duration,
) {
    while let Some(message) = inbound.recv().await {
        match message {
            Inbound::Request(request) => {
                let Some(t) = transport.upgrade() else { return };
                let Request { id, method, params } = request;
                if era == Era::Modern {
                    tracing::warn!(server, %method, "modern server sent a request; refused (2026-07-28 servers must not)");
                    let error = RpcError::new(
                        INVALID_REQUEST,
                        "servers must not send requests in protocol 2026-07-28",
                    );
                    let _ = t.respond(id, Err(error), timeout).await;
                    continue;
                }
                if method == "ping" {
                    let _ = t.respond(id, Ok(json!({})), timeout).await;
                    continue;
                }
                let (reply, answer) = oneshot::channel();
                let event = ServerEvent::Request(ServerRequest {
                    method: method.clone(),
                    params: params.unwrap_or(Value::Null),
                    reply,
                });
                if events.try_send(event).is_err() {
                    tracing::warn!(server, %method, "no capacity to handle a server request; refused");
                    let error = RpcError::new(
                        METHOD_NOT_FOUND,
                        format!("client cannot handle {method} now"),
                    );
                    let _ = t.respond(id, Err(error), timeout).await;
                    continue;
                }
                let weak = transport.clone();
                tokio::spawn(async move {
                    let outcome = match tokio::time::timeout(timeout, answer).await {
                        Ok(Ok(outcome)) => outcome,
                        _ => Err(RpcError::new(INTERNAL_ERROR, "the client did not answer")),
                    };
                    if let Some(t) = weak.upgrade() {
                        let _ = t.respond(id, outcome, timeout).await;
                    }
                });
            }
            Inbound::Notification(n) => {
                if events.try_send(ServerEvent::Notification(n)).is_err() {
                    tracing::debug!(
                        server,
                        "server notification dropped: event channel full or closed"
                    );
                }
            }
            Inbound::Closed(error) => {
                let _ = events.send(ServerEvent::Closed(error)).await;
                return;
            }
        }
    }
}
