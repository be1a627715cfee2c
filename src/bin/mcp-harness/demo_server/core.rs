//! The demo server's transport-independent part: method dispatch, era rules,
//! validation of the modern envelope, and the request log.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use mcp_harness::protocol::error::{
    INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, UNSUPPORTED_PROTOCOL_VERSION,
};
use mcp_harness::protocol::meta::{
    KEY_CLIENT_CAPABILITIES, KEY_PROTOCOL_VERSION, KEY_SERVER_INFO, LEGACY_VERSIONS,
};
use mcp_harness::protocol::{Message, Notification, Request, RequestId, RpcError};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::{DemoServerArgs, OnDiscover, tools};

/// Which era the demo server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServeEra {
    /// 2026-07-28 only: no handshake; `initialize` gets -32022.
    Modern,
    /// 2025-11-25 / 2025-06-18 only: `initialize` first; discover per `--on-discover`.
    Legacy,
    /// Both: answers discover, and `initialize` starts a legacy session.
    Dual,
}

/// What the server does about one request.
pub enum Action {
    /// Send this response.
    Reply(Result<Value, RpcError>),
    /// Never answer.
    NoReply,
    /// Write bytes that are not JSON-RPC instead of an answer.
    Garbage,
    /// Write one line (or body) of this many bytes instead of an answer.
    Oversize(usize),
    /// Exit the process with this code, without answering.
    Exit(i32),
    /// Close stdout and keep running (stdio); on HTTP, the HTTP-only faults below.
    CloseStdout,
    /// HTTP only: answer with this status and no body.
    HttpStatus(u16),
    /// HTTP only: answer 200 with a content type that is neither JSON nor SSE.
    WrongContentType,
    /// HTTP only: answer 307 to this URL.
    Redirect(String),
    /// HTTP only: an event stream that never ends and never answers.
    EndlessStream,
    /// HTTP legacy only: end the event stream before the response, which a resuming GET
    /// (`Last-Event-ID`) then delivers; or, `then_exit`, exit before the client resumes.
    /// With `polls`, that many resumptions first get an event and the stream's end (a
    /// server that closes its stream at will, the client polling: 2025-11-25).
    BrokenStream { then_exit: bool, polls: u32 },
    /// Answer `{}`-like success, then forget the legacy HTTP session (stdio: just answer).
    ExpireSession,
    /// Write this text instead of an answer (`{id}` becomes the request's id); may hold
    /// several lines, or broken JSON.
    RawLine(String),
    /// Write this text without a newline, then exit (a partial line, then EOF).
    RawThenExit(String),
}

/// Something the server writes: a message, raw bytes (faults), or the end of stdout.
pub enum Out {
    Message(Message),
    Raw(Vec<u8>),
    CloseStdout,
}

/// Requests this server sent to the client, waiting for their answers.
pub type Pending = Arc<Mutex<HashMap<RequestId, oneshot::Sender<Result<Value, RpcError>>>>>;

/// The client as seen from one request: notifications and (legacy) requests to it.
#[derive(Clone)]
pub struct Peer {
    tx: mpsc::UnboundedSender<Out>,
    pending: Pending,
}

/// The ids of the requests this server sends: one count for the process, as the
/// concurrent requests of one legacy HTTP session await their answers in one map.
static NEXT_ID: AtomicI64 = AtomicI64::new(1);

impl Peer {
    pub fn new(tx: mpsc::UnboundedSender<Out>, pending: Pending) -> Peer {
        Peer { tx, pending }
    }

    /// Whether the client is gone (an HTTP stream closed).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    pub fn notify(&self, method: &str, params: Value) {
        let n = Notification {
            method: method.into(),
            params: Some(params),
        };
        let _ = self.tx.send(Out::Message(Message::Notification(n)));
    }

    /// Sends a server-to-client request (legacy era) and waits for the answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.send_request(method, params).await
    }

    /// Queues a server-to-client request now (before whatever is sent after this
    /// returns); the answer comes through what it returns.
    pub fn send_request(
        &self,
        method: &str,
        params: Value,
    ) -> impl Future<Output = Result<Value, RpcError>> + Send + 'static {
        self.send_request_named(method, params).1
    }

    /// Sends a server-to-client request, and gives it up (`notifications/cancelled`)
    /// if it is not answered within `after`, as a server whose user moved on does.
    pub async fn request_or_give_up(
        &self,
        method: &str,
        params: Value,
        after: std::time::Duration,
    ) -> Option<Result<Value, RpcError>> {
        let (id, answer) = self.send_request_named(method, params);
        match tokio::time::timeout(after, answer).await {
            Ok(answer) => Some(answer),
            Err(_) => {
                self.pending.lock().remove(&id);
                self.notify(
                    "notifications/cancelled",
                    json!({"requestId": id, "reason": "gave up"}),
                );
                None
            }
        }
    }

    /// Sends a request without its `"jsonrpc": "2.0"` (a malformed one a client should
    /// refuse under its id) and waits for the answer.
    pub async fn request_malformed(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.send_request_as(method, params, true).1.await
    }

    fn send_request_named(
        &self,
        method: &str,
        params: Value,
    ) -> (
        RequestId,
        impl Future<Output = Result<Value, RpcError>> + Send + 'static,
    ) {
        self.send_request_as(method, params, false)
    }

    fn send_request_as(
        &self,
        method: &str,
        params: Value,
        malformed: bool,
    ) -> (
        RequestId,
        impl Future<Output = Result<Value, RpcError>> + Send + 'static,
    ) {
        let id = RequestId::String(format!("srv-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id.clone(), tx);
        let out = if malformed {
            let line = json!({"id": id, "method": method, "params": params});
            Out::Raw(format!("{line}\n").into_bytes())
        } else {
            Out::Message(Message::Request(Request {
                id: id.clone(),
                method: method.into(),
                params: Some(params),
            }))
        };
        let _ = self.tx.send(out);
        (id, async move {
            rx.await
                .unwrap_or_else(|_| Err(RpcError::new(-32603, "client went away")))
        })
    }

    /// Routes a client's answer to the request that waits for it.
    pub fn deliver(
        pending: &Mutex<HashMap<RequestId, oneshot::Sender<Result<Value, RpcError>>>>,
        id: &RequestId,
        outcome: Result<Value, RpcError>,
    ) {
        if let Some(tx) = pending.lock().remove(id) {
            let _ = tx.send(outcome);
        }
    }
}

/// One request's context.
pub struct Ctx {
    pub peer: Peer,
    /// The request belongs to a legacy session (after `initialize`).
    pub legacy: bool,
    /// HTTP request headers, lower-cased names; empty on stdio.
    pub headers: BTreeMap<String, String>,
    /// A legacy HTTP session's standalone GET streams, if any are open.
    pub broadcast: Option<Peer>,
}

impl Ctx {
    /// The client capabilities this request declared (modern `_meta`).
    pub fn capabilities<'a>(&self, request: &'a Request) -> Option<&'a Value> {
        request
            .params
            .as_ref()?
            .get("_meta")?
            .get(KEY_CLIENT_CAPABILITIES)
    }
}

pub struct DemoServer {
    pub args: DemoServerArgs,
    calls: AtomicU64,
    record: Option<Arc<Mutex<std::fs::File>>>,
    /// The tools of `--tools-file`, served instead of the built-in ones.
    file_tools: Option<Vec<Value>>,
    /// Tools added at run time by the `grow` tool (its list changes).
    pub grown: AtomicU64,
    /// Open `subscriptions/listen` requests: their ids and streams.
    listeners: Mutex<Vec<(RequestId, Peer)>>,
    /// While `now` is before this, every request waits (a hung server).
    pub frozen_until: Mutex<Option<std::time::Instant>>,
    /// What the client answered to `ask_later`.
    pub last_ask: Arc<Mutex<Option<String>>>,
    /// Whether the last `initialize` declared elicitation.
    client_elicitation: AtomicBool,
    /// Whether a request was seen yet (for `--reject-first-request`).
    seen_first: AtomicBool,
    /// Whether `--notify-at-discover` has sent its notifications.
    notified: AtomicBool,
    /// `tools/list` answers so far (for `--alternate-tools`).
    lists: AtomicU64,
    /// Requests handled, `server/discover` aside (for `--retire-version-after`).
    handled: AtomicU64,
    /// Calls of `region_echo` (for `--rename-param-header-after`).
    pub region_calls: AtomicU64,
    /// `subscriptions/listen` requests so far (for `--unavailable-listens`).
    pub listens_begun: AtomicU64,
    /// Whether a session was ended on a call (for `--expire-on-first-call`).
    pub expired_on_call: AtomicBool,
}

impl DemoServer {
    pub fn new(args: DemoServerArgs) -> anyhow::Result<Arc<DemoServer>> {
        let record = match &args.record {
            // Headers are kept as sent, bearer tokens with them: for this user only.
            Some(path) => Some(Arc::new(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(path)
                    .and_then(|f| {
                        // `mode` applies to a file made here; one there already is
                        // made so too (a regular one: not /dev/null or a terminal).
                        if f.metadata()?.is_file() {
                            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                        }
                        Ok(f)
                    })?,
            ))),
            None => None,
        };
        let file_tools = match &args.tools_file {
            Some(path) => {
                let list: Value = serde_json::from_slice(&std::fs::read(path)?)?;
                match list.get("tools").and_then(Value::as_array) {
                    Some(tools) => Some(tools.clone()),
                    None => anyhow::bail!("{}: no tools array", path.display()),
                }
            }
            None => None,
        };
        Ok(Arc::new(DemoServer {
            file_tools,
            args,
            calls: AtomicU64::new(0),
            record,
            grown: AtomicU64::new(0),
            listeners: Mutex::new(Vec::new()),
            frozen_until: Mutex::new(None),
            last_ask: Arc::new(Mutex::new(None)),
            client_elicitation: AtomicBool::new(false),
            seen_first: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            lists: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            region_calls: AtomicU64::new(0),
            listens_begun: AtomicU64::new(0),
            expired_on_call: AtomicBool::new(false),
        }))
    }

    /// Records a request as it arrives (before it is handled, so the log keeps the
    /// order of arrival even when handlers run concurrently).
    pub fn log(&self, request: &Request, ctx: &Ctx) {
        if self.record.is_some() {
            self.record(json!({"method": request.method, "id": request.id, "params": request.params, "headers": ctx.headers}));
        }
    }

    /// Appends one line to the `--record` file, if there is one.
    pub fn record(&self, line: Value) {
        record_to(self.record.as_ref(), line);
    }

    /// A handle on the `--record` file for tasks that outlive a request.
    pub fn recorder(&self) -> impl Fn(Value) + Send + 'static {
        let file = self.record.clone();
        move |line| record_to(file.as_ref(), line)
    }
}

fn record_to(file: Option<&Arc<Mutex<std::fs::File>>>, line: Value) {
    if let Some(file) = file {
        // One write per line: several servers may append to the same file.
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let _ = file.lock().write_all(&bytes);
    }
}

impl DemoServer {
    pub fn server_info(&self) -> Value {
        json!({"name": self.args.name, "version": env!("CARGO_PKG_VERSION")})
    }

    /// The tools as listed now, given the client's elicitation capability.
    pub fn catalog(&self, elicitation: bool) -> Vec<Value> {
        if let Some(tools) = &self.file_tools {
            return tools.clone();
        }
        let mut all = tools::catalog(&self.args, elicitation);
        let renamed = self
            .args
            .rename_param_header_after
            .is_some_and(|n| self.region_calls.load(Ordering::SeqCst) >= n);
        if renamed && let Some(t) = all.iter_mut().find(|t| t["name"] == "region_echo") {
            t["inputSchema"]["properties"]["region"]["x-mcp-header"] = json!("Zone");
        }
        all
    }

    /// The modern versions supported now (`--retire-version-after` drops the first).
    fn versions(&self) -> &[String] {
        let retired = self
            .args
            .retire_version_after
            .is_some_and(|n| self.handled.load(Ordering::SeqCst) > n);
        if retired && self.args.versions.len() > 1 {
            &self.args.versions[1..]
        } else {
            &self.args.versions
        }
    }

    fn hints(&self) -> (Value, Value) {
        (json!(self.args.ttl_ms), json!(self.args.cache_scope))
    }

    /// Handles one request.
    pub async fn handle(self: &Arc<Self>, request: Request, ctx: Ctx) -> Action {
        let frozen = *self.frozen_until.lock();
        if let Some(until) = frozen {
            tokio::time::sleep_until(until.into()).await;
        }
        if self.args.ping_before_initialize
            && request.method == "initialize"
            && let Err(e) = ctx.peer.request("ping", json!({})).await
        {
            return Action::Reply(Err(e));
        }
        if let Some(action) = self.before_session(&request, &ctx) {
            return action;
        }
        let modern_request = !ctx.legacy;
        if modern_request && let Err(e) = self.check_envelope(&request, &ctx) {
            return Action::Reply(Err(e));
        }
        match self.method(&request, &ctx).await {
            Action::Reply(Ok(result)) if modern_request => {
                Action::Reply(Ok(self.finish_modern(&request, result)))
            }
            other => other,
        }
    }

    /// What is answered before any session or envelope rule: `ping`, `initialize`, a
    /// legacy server's answer to `server/discover`, the first-request quirk.
    fn before_session(&self, request: &Request, ctx: &Ctx) -> Option<Action> {
        if request.method != "server/discover" {
            self.handled.fetch_add(1, Ordering::SeqCst);
        } else if self.args.notify_at_discover > 0 && !self.notified.swap(true, Ordering::SeqCst) {
            let data = "x".repeat(self.args.notification_bytes);
            for _ in 0..self.args.notify_at_discover {
                ctx.peer.notify(
                    "notifications/message",
                    json!({"level": "info", "data": data}),
                );
            }
        }
        match request.method.as_str() {
            "ping" => return Some(Action::Reply(Ok(json!({})))),
            "server/discover" if self.args.discover_error.is_some() => {
                let code = self.args.discover_error.unwrap_or(-32603);
                let data = match code {
                    -32021 => json!({"requiredCapabilities": {"sampling": {}}}),
                    -32022 => json!({"supported": ["1999-01-01"], "requested": "?"}),
                    _ => Value::Null,
                };
                let mut e = RpcError::new(code, "refused at discover");
                if !data.is_null() {
                    e = e.with_data(data);
                }
                return Some(Action::Reply(Err(e)));
            }
            "initialize" => return Some(Action::Reply(self.initialize(request))),
            "server/discover" if self.args.era == ServeEra::Legacy => {
                return Some(match self.args.on_discover {
                    OnDiscover::Error => {
                        Action::Reply(Err(RpcError::new(METHOD_NOT_FOUND, "Method not found")))
                    }
                    OnDiscover::Ignore => Action::NoReply,
                    OnDiscover::Exit => Action::Exit(1),
                    OnDiscover::ErrorThenExit => Action::RawThenExit(
                        r#"{"jsonrpc":"2.0","id":{id},"error":{"code":-32600,"message":"expected initialize"}}
"#
                        .into(),
                    ),
                });
            }
            _ => {}
        }
        if self.args.era == ServeEra::Legacy && !ctx.legacy {
            return Some(Action::Reply(Err(RpcError::new(
                INVALID_REQUEST,
                "server not initialized",
            ))));
        }
        if self.args.reject_first_request && !self.seen_first.swap(true, Ordering::SeqCst) {
            let asked = request
                .params
                .as_ref()
                .and_then(|p| p.get("_meta"))
                .and_then(|m| m.get(KEY_PROTOCOL_VERSION))
                .cloned()
                .unwrap_or(json!(""));
            return Some(Action::Reply(Err(RpcError::new(
                UNSUPPORTED_PROTOCOL_VERSION,
                "not ready for you yet",
            )
            .with_data(json!({"supported": [asked], "requested": asked})))));
        }
        None
    }

    /// The method's own work.
    async fn method(self: &Arc<Self>, request: &Request, ctx: &Ctx) -> Action {
        match request.method.as_str() {
            "server/discover" => Action::Reply(Ok(self.discover())),
            "tools/list" => {
                // Read when asked, sent late: a change meanwhile is not in this answer.
                let list = self.list_tools(request, ctx);
                if self.args.list_delay_ms > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(self.args.list_delay_ms))
                        .await;
                }
                Action::Reply(list)
            }
            "tools/call" => {
                let n = self.calls.fetch_add(1, Ordering::SeqCst);
                if self.args.crash_after.is_some_and(|limit| n >= limit) {
                    return Action::Exit(1);
                }
                tools::call(self, request, ctx).await
            }
            "subscriptions/listen" => self.listen(request, ctx),
            "prompts/list" => Action::Reply(Ok(
                json!({"prompts": [{"name": "greet", "description": "Greets someone", "arguments": [{"name": "who", "required": true}]}]}),
            )),
            "prompts/get" => Action::Reply(tools::get_prompt(request)),
            "resources/list" => {
                if self.args.list_delay_ms > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(self.args.list_delay_ms))
                        .await;
                }
                let mut resources = vec![
                    json!({"uri": "demo://readme", "name": "readme", "mimeType": "text/plain"}),
                ];
                resources.extend(
                    (self.args.list_resource.iter()).map(|uri| json!({"uri": uri, "name": uri})),
                );
                Action::Reply(Ok(json!({ "resources": resources })))
            }
            "resources/templates/list" if !self.args.no_templates_method => Action::Reply(Ok(
                tools::resource_templates(self.args.resource_template, &self.args.list_template),
            )),
            "resources/read" => {
                let uri = (request.params.as_ref())
                    .and_then(|p| p.get("uri"))
                    .and_then(Value::as_str);
                match uri.filter(|u| self.args.list_resource.iter().any(|l| l == u)) {
                    // What `--list-resource` lists is read as a line naming it.
                    Some(uri) => Action::Reply(Ok(
                        json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": format!("listed {uri}")}]}),
                    )),
                    None => {
                        Action::Reply(tools::read_resource(request, self.args.resource_template))
                    }
                }
            }
            other => Action::Reply(Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            ))),
        }
    }

    /// Opens a subscription: acknowledges what of the filter it serves (tool list
    /// changes only), then holds the request open.
    fn listen(&self, request: &Request, ctx: &Ctx) -> Action {
        if self.args.refuse_listen {
            return Action::Reply(Err(RpcError::new(
                METHOD_NOT_FOUND,
                "Method not found: subscriptions/listen",
            )));
        }
        let asked = request
            .params
            .as_ref()
            .and_then(|p| p.get("notifications"))
            .and_then(|n| n.get("toolsListChanged"))
            == Some(&json!(true));
        let id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
        ctx.peer.notify(
            "notifications/subscriptions/acknowledged",
            json!({"notifications": {"toolsListChanged": asked},
                   "_meta": {"io.modelcontextprotocol/subscriptionId": id}}),
        );
        if asked {
            let mut listeners = self.listeners.lock();
            listeners.retain(|(_, p)| !p.is_closed());
            listeners.push((request.id.clone(), ctx.peer.clone()));
        }
        Action::NoReply
    }

    /// Ends a subscription the client cancelled (stdio).
    pub fn unlisten(&self, id: &RequestId) {
        self.listeners.lock().retain(|(i, _)| i != id);
    }

    /// Tells every open subscription that the tool list changed.
    pub fn tools_changed(&self) {
        let mut listeners = self.listeners.lock();
        listeners.retain(|(_, p)| !p.is_closed());
        for (id, peer) in listeners.iter() {
            let id = serde_json::to_value(id).unwrap_or(Value::Null);
            peer.notify(
                "notifications/tools/list_changed",
                json!({"_meta": {"io.modelcontextprotocol/subscriptionId": id}}),
            );
            if self.args.cancel_listens {
                peer.notify(
                    "notifications/cancelled",
                    json!({"requestId": id, "reason": "subscription ended by the server"}),
                );
            }
        }
        if self.args.cancel_listens {
            listeners.clear();
        }
    }

    /// Adds `resultType`, the server info, and cache hints to a modern result.
    fn finish_modern(&self, request: &Request, mut result: Value) -> Value {
        let method = request.method.as_str();
        if let Value::Object(map) = &mut result {
            map.entry("resultType").or_insert_with(|| json!("complete"));
            let meta = map.entry("_meta").or_insert_with(|| json!({}));
            if let Value::Object(meta) = meta {
                meta.insert(KEY_SERVER_INFO.into(), self.server_info());
            }
            let cacheable = matches!(
                method,
                "tools/list"
                    | "prompts/list"
                    | "resources/list"
                    | "resources/templates/list"
                    | "resources/read"
                    | "server/discover"
            );
            if cacheable && map.get("resultType") == Some(&json!("complete")) && !self.args.no_hints
            {
                let (mut ttl, mut scope) = self.hints();
                if method == "tools/list" && !self.args.page_ttls.is_empty() {
                    let at = self.page_number(request).min(self.args.page_ttls.len() - 1);
                    ttl = json!(self.args.page_ttls[at]);
                }
                if method == "tools/list" && !self.args.page_scopes.is_empty() {
                    let at = self
                        .page_number(request)
                        .min(self.args.page_scopes.len() - 1);
                    scope = json!(self.args.page_scopes[at]);
                }
                map.entry("ttlMs").or_insert(ttl);
                map.entry("cacheScope").or_insert(scope);
            }
        }
        result
    }

    /// What a 2026-07-28 server must check on every request (and on HTTP, its headers).
    fn check_envelope(&self, request: &Request, ctx: &Ctx) -> Result<(), RpcError> {
        let meta = request.params.as_ref().and_then(|p| p.get("_meta"));
        let version = meta
            .and_then(|m| m.get(KEY_PROTOCOL_VERSION))
            .and_then(Value::as_str);
        let caps = meta.and_then(|m| m.get(KEY_CLIENT_CAPABILITIES));
        let (Some(version), Some(Value::Object(_))) = (version, caps) else {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "missing _meta protocolVersion or clientCapabilities",
            ));
        };
        let supported = self.versions();
        if !supported.iter().any(|v| v == version) {
            return Err(RpcError::new(
                UNSUPPORTED_PROTOCOL_VERSION,
                "unsupported protocol version",
            )
            .with_data(json!({"supported": supported, "requested": version})));
        }
        if !ctx.headers.is_empty() {
            super::http::check_headers(request, version, &ctx.headers, &self.catalog(true))?;
        }
        Ok(())
    }

    /// What it offers: tools (whose list it says changes, unless told not to), prompts
    /// and resources.
    fn capabilities(&self) -> Value {
        let changes = !self.args.no_list_changed;
        json!({"tools": {"listChanged": changes}, "prompts": {}, "resources": {}})
    }

    fn discover(&self) -> Value {
        let mut versions = self.versions().to_vec();
        if self.args.era == ServeEra::Dual {
            versions.extend(LEGACY_VERSIONS.iter().map(|v| v.to_string()));
        }
        json!({
            "supportedVersions": versions,
            "capabilities": self.capabilities(),
            "instructions": format!("{}: a demo MCP server shipped with mcp-harness", self.args.name),
        })
    }

    fn initialize(&self, request: &Request) -> Result<Value, RpcError> {
        let requested = request
            .params
            .as_ref()
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if self.args.era == ServeEra::Modern {
            return Err(RpcError::new(
                UNSUPPORTED_PROTOCOL_VERSION,
                "this server has no initialize handshake",
            )
            .with_data(json!({"supported": self.args.versions, "requested": requested})));
        }
        let version = match &self.args.legacy_version {
            Some(forced) => forced.as_str(),
            None if LEGACY_VERSIONS.contains(&requested) => requested,
            None => LEGACY_VERSIONS[0],
        };
        let elicitation = request
            .params
            .as_ref()
            .and_then(|p| p.get("capabilities"))
            .is_some_and(|c| c.get("elicitation").is_some());
        self.client_elicitation.store(elicitation, Ordering::SeqCst);
        Ok(json!({
            "protocolVersion": version,
            "capabilities": self.capabilities(),
            "serverInfo": self.server_info(),
            "instructions": format!("{}: a demo MCP server shipped with mcp-harness (legacy)", self.args.name),
        }))
    }

    /// Which page of `tools/list` a request asks for (0 for the first): its cursor
    /// holds the offset of the page's first tool.
    fn page_number(&self, request: &Request) -> usize {
        let per_page = if self.args.huge_pages.is_some() {
            1
        } else {
            self.args.page_size.max(1)
        };
        self.page_start(request).unwrap_or(0) / per_page
    }

    /// The offset of the first tool of the page a `tools/list` cursor names
    /// (`e<epoch>-page-<n>`); an error for a cursor that is not one of ours, or of
    /// another epoch.
    fn page_start(&self, request: &Request) -> Result<usize, RpcError> {
        let bad = || RpcError::new(self.args.cursor_refusal_code, "invalid cursor");
        match request.params.as_ref().and_then(|p| p.get("cursor")) {
            None | Some(Value::Null) => Ok(0),
            Some(Value::String(c)) => {
                let prefix = format!("e{}-page-", self.args.cursor_epoch);
                c.strip_prefix(&prefix)
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(bad)
            }
            Some(_) => Err(bad()),
        }
    }

    fn list_tools(&self, request: &Request, ctx: &Ctx) -> Result<Value, RpcError> {
        if self.args.list_input_required {
            return Ok(json!({
                "resultType": "input_required",
                "requestState": "list-state",
                "ttlMs": 600_000,
                "cacheScope": "public",
            }));
        }
        let start = self.page_start(request)?;
        if let Some(mib) = self.args.huge_pages {
            // Hostile: a huge page and a fresh cursor, forever.
            let description = "x".repeat(mib * 1024 * 1024);
            return Ok(json!({
                "tools": [{"name": format!("huge_{start}"), "description": description, "inputSchema": {"type": "object"}}],
                "nextCursor": format!("e{}-page-{}", self.args.cursor_epoch, start.saturating_add(1)),
            }));
        }
        let elicitation = if ctx.legacy {
            self.client_elicitation.load(Ordering::SeqCst)
        } else {
            ctx.capabilities(request)
                .is_some_and(|c| c.get("elicitation").is_some())
        };
        let mut all = self.catalog(elicitation);
        if let Some(mib) = self.args.huge_schema {
            let description = "x".repeat(mib * 1024 * 1024);
            all.push(json!({"name": "huge", "description": description, "inputSchema": {"type": "object"}}));
        }
        for n in 0..self.grown.load(Ordering::SeqCst) {
            all.push(json!({"name": format!("grown_{n}"), "inputSchema": {"type": "object"}}));
        }
        if self.args.alternate_tools && self.lists.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            all.push(json!({"name": "alt", "inputSchema": {"type": "object"}}));
        }
        if start > all.len() {
            return Err(RpcError::new(INVALID_PARAMS, "invalid cursor"));
        }
        let size = if self.args.page_size == 0 {
            all.len()
        } else {
            self.args.page_size
        };
        let end = start.saturating_add(size).min(all.len());
        let mut result = json!({"tools": all[start..end]});
        if end < all.len() {
            result["nextCursor"] = json!(format!("e{}-page-{end}", self.args.cursor_epoch));
        }
        match self.args.malformed_list.as_deref() {
            Some("tools-object") => result["tools"] = json!({"echo": {}}),
            Some("cursor-number") => result["nextCursor"] = json!(2),
            _ => {}
        }
        Ok(result)
    }
}
