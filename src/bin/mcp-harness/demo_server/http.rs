//! The demo server over Streamable HTTP on loopback (hyper, HTTP/1.1).
//!
//! Modern requests are checked like a 2026-07-28 server must (headers against body);
//! legacy requests need the `Mcp-Session-Id` that `initialize` handed out (404 for an
//! unknown one). Tools that send messages before their result answer with an event
//! stream; `--sse` makes every answer one.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, StatusCode};
use mcp_harness::protocol::error::{
    HEADER_MISMATCH, INTERNAL_ERROR, METHOD_NOT_FOUND, PARSE_ERROR,
};
use mcp_harness::protocol::{Message, Notification, Request, RequestId, Response, RpcError};
use mcp_harness::transport::http::headers::{mcp_name, param_headers, param_value};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::DemoServerArgs;
use super::core::{Action, Ctx, DemoServer, Out, Peer, Pending, ServeEra};
use super::tools;

use crate::loopback::{self, HttpResponse, full};

/// The largest request body read (16 MiB, as the harness's own default message bound):
/// one past it is refused before it is all in memory.
const MAX_BODY: usize = 16 << 20;

#[derive(Default)]
struct Session {
    pending: Pending,
    streams: Vec<mpsc::UnboundedSender<Out>>,
    /// The response a broken stream did not deliver; a GET with `Last-Event-ID` gets it.
    resume: Option<Message>,
    /// GETs with `Last-Event-ID` that get an event and the stream's end before one
    /// gets `resume`.
    polls: u32,
}

struct State {
    server: Arc<DemoServer>,
    /// `http(s)://ADDR`, as announced.
    base: String,
    sessions: Mutex<HashMap<String, Session>>,
    next_session: AtomicU64,
    /// GET streams asked for so far (`--fail-gets`).
    gets: AtomicU64,
    /// GET streams refused so far (`--oauth-refuse-gets`).
    refused_gets: AtomicU64,
    /// Listen requests refused so far (`--oauth-refuse-listens`).
    refused_listens: AtomicU64,
}

/// A response body fed by a channel: one SSE frame per message.
struct ChannelBody(mpsc::UnboundedReceiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

pub async fn serve(server: Arc<DemoServer>, addr: &str) -> anyhow::Result<()> {
    let tls = loopback::tls_acceptor(
        server.args.tls_cert.as_deref(),
        server.args.tls_key.as_deref(),
    )?;
    let (listener, base) =
        loopback::bind(addr, tls.is_some(), "/mcp", server.args.ignore_sigterm).await?;
    let state = Arc::new(State {
        server,
        base,
        sessions: Mutex::new(HashMap::new()),
        next_session: AtomicU64::new(0),
        gets: AtomicU64::new(0),
        refused_gets: AtomicU64::new(0),
        refused_listens: AtomicU64::new(0),
    });
    loopback::serve(listener, tls, move |req| handle(state.clone(), req)).await
}

fn json_message(status: StatusCode, message: &Message) -> HttpResponse {
    let mut body = Vec::new();
    message.write_json(&mut body);
    full(status, "application/json", body)
}

fn sse_frame(message: &Message, event_id: u64) -> Bytes {
    let mut data = Vec::new();
    message.write_json(&mut data);
    let mut frame = format!("id: {event_id}\ndata: ").into_bytes();
    frame.extend_from_slice(&data);
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

fn sse_response(rx: mpsc::UnboundedReceiver<Bytes>) -> HttpResponse {
    let mut r = hyper::Response::new(ChannelBody(rx).boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// Forwards `Out` messages as SSE frames until the sender side closes.
fn pump_sse(mut out: mpsc::UnboundedReceiver<Out>) -> mpsc::UnboundedReceiver<Bytes> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut n = 0;
        // A priming event with only an id, as servers send so clients can resume.
        let _ = tx.send(Bytes::from_static(b"id: 0\nretry: 1000\ndata:\n\n"));
        while let Some(o) = out.recv().await {
            let frame = match o {
                Out::Message(m) => {
                    n += 1;
                    sse_frame(&m, n)
                }
                // Each line its own data field: the event's data is the text as written.
                Out::Raw(bytes) => {
                    let mut frame = Vec::new();
                    for line in bytes.split(|b| *b == b'\n') {
                        frame.extend_from_slice(b"data: ");
                        frame.extend_from_slice(line);
                        frame.push(b'\n');
                    }
                    frame.push(b'\n');
                    Bytes::from(frame)
                }
                Out::CloseStdout => continue,
            };
            if tx.send(frame).is_err() {
                return;
            }
        }
    });
    rx
}

async fn handle(state: Arc<State>, req: hyper::Request<Incoming>) -> HttpResponse {
    let headers: BTreeMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mut headers = headers;
    if let Some(reply) = oauth_gate(&state, &req, &mut headers) {
        return reply;
    }
    let session_id = headers.get("mcp-session-id").cloned();
    let known_session = session_id
        .as_ref()
        .map(|id| state.sessions.lock().contains_key(id));
    if known_session == Some(false) {
        return full(StatusCode::NOT_FOUND, "", "unknown session");
    }
    match *req.method() {
        Method::POST => {}
        Method::GET if known_session == Some(true) => {
            state
                .server
                .record(json!({"method": "GET", "headers": headers}));
            if state.server.args.close_get_streams {
                return full(StatusCode::OK, "text/event-stream", "");
            }
            if state.server.args.hang_gets {
                std::future::pending::<()>().await;
            }
            if state.gets.fetch_add(1, Ordering::Relaxed) < state.server.args.fail_gets {
                return full(StatusCode::SERVICE_UNAVAILABLE, "", "restarting");
            }
            let (tx, rx) = mpsc::unbounded_channel();
            if let Some(id) = &session_id
                && let Some(session) = state.sessions.lock().get_mut(id)
            {
                match (headers.contains_key("last-event-id"), session.resume.take()) {
                    (true, Some(message)) if session.polls > 0 => {
                        session.polls -= 1;
                        session.resume = Some(message);
                        let _ = tx.send(Out::Message(Message::Notification(Notification {
                            method: "notifications/message".into(),
                            params: Some(json!({"level": "info", "data": "still working"})),
                        })));
                    }
                    (true, Some(message)) => {
                        let _ = tx.send(Out::Message(message));
                    }
                    (_, resume) => {
                        session.resume = resume;
                        // A client that opens its stream again left the old one closed.
                        session.streams.retain(|t| !t.is_closed());
                        session.streams.push(tx);
                    }
                }
            }
            return sse_response(pump_sse(rx));
        }
        Method::DELETE if known_session == Some(true) => {
            state
                .server
                .record(json!({"method": "DELETE", "headers": headers}));
            if let Some(id) = &session_id {
                state.sessions.lock().remove(id);
            }
            return full(StatusCode::OK, "", "");
        }
        _ => return full(StatusCode::METHOD_NOT_ALLOWED, "", ""),
    }
    post(state, req, headers, session_id, known_session).await
}

/// This server's origin as the client named it (`Host`), so that a client that reached
/// it by name (`localhost`) is told of its metadata on that origin; the bound address
/// otherwise.
fn origin(state: &State, headers: &BTreeMap<String, String>) -> String {
    let scheme = state.base.split("://").next().unwrap_or("http");
    match headers.get("host") {
        Some(host)
            if !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)) =>
        {
            format!("{scheme}://{host}")
        }
        _ => state.base.clone(),
    }
}

/// `--oauth-issuer`: serves the protected resource metadata, and answers a request
/// without a valid token (issuer, audience, expiry, scope) with 401 and a challenge. A
/// valid token's subject and scopes go on as `x-demo-subject` / `x-demo-scopes`.
fn oauth_gate(
    state: &State,
    req: &hyper::Request<Incoming>,
    headers: &mut BTreeMap<String, String>,
) -> Option<HttpResponse> {
    use super::PrmAt;
    let args = &state.server.args;
    let issuer = args.oauth_issuer.as_ref()?;
    let base = match &args.oauth_prm_host {
        Some(_) => state.base.clone(),
        None => origin(state, headers),
    };
    let prm_base = match &args.oauth_prm_host {
        Some(host) => state.base.replacen("127.0.0.1", host, 1),
        None => base.clone(),
    };
    let resource = match (&args.oauth_resource, args.oauth_resource_root) {
        (Some(r), _) => r.clone(),
        (None, true) => format!("{base}/"),
        (None, false) => format!("{base}/mcp"),
    };
    let path_prm = "/.well-known/oauth-protected-resource/mcp";
    let root_prm = "/.well-known/oauth-protected-resource";
    let path = req.uri().path();
    if req.method() == Method::GET && (path == path_prm || path == root_prm) {
        state
            .server
            .record(json!({"method": "GET", "path": path, "headers": headers}));
        let served = match args.oauth_prm {
            PrmAt::Header | PrmAt::Path => path == path_prm,
            PrmAt::Root => path == root_prm,
        };
        if !served {
            return Some(full(StatusCode::NOT_FOUND, "", ""));
        }
        let prm = json!({
            "resource": resource,
            "authorization_servers": [issuer],
            "scopes_supported": ["mcp:read", "mcp:write"],
            "bearer_methods_supported": ["header"],
        });
        return Some(full(StatusCode::OK, "application/json", prm.to_string()));
    }
    let challenge = |status: StatusCode, error: Option<&str>, scope: &str| {
        let mut c = String::from("Bearer");
        let mut params = Vec::new();
        if let Some(e) = error {
            params.push(format!("error=\"{e}\""));
        }
        if args.oauth_prm == PrmAt::Header {
            params.push(format!("resource_metadata=\"{prm_base}{path_prm}\""));
        }
        if !args.oauth_no_scope_hint || error.is_some() {
            params.push(format!("scope=\"{scope}\""));
        }
        if !params.is_empty() {
            c.push(' ');
            c.push_str(&params.join(", "));
        }
        let mut r = full(status, "", "");
        if let Ok(v) = c.parse() {
            r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, v);
        }
        r
    };
    let token = headers
        .get("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(String::from);
    let claims = token.and_then(|t| crate::demo_token::verify(&args.oauth_secret, &t));
    let valid = claims.filter(|c| {
        &c.iss == issuer
            && c.aud == resource
            && c.exp > crate::demo_token::now()
            && args.oauth_refuse_subject.as_deref() != Some(c.sub.as_str())
    });
    // `--oauth-refuse-gets`: a GET stream refused however good its token (a server
    // that dropped its tokens, say), the first N times.
    let refuse_get = valid.is_some()
        && req.method() == Method::GET
        && state.refused_gets.fetch_add(1, Ordering::Relaxed) < args.oauth_refuse_gets;
    // `--oauth-refuse-listens`: the same for `subscriptions/listen` (the client signs
    // in again and sends it under a new id).
    let refuse_listen = valid.is_some()
        && headers.get("mcp-method").map(String::as_str) == Some("subscriptions/listen")
        && state.refused_listens.fetch_add(1, Ordering::Relaxed) < args.oauth_refuse_listens;
    let Some(claims) = valid.filter(|_| !refuse_get && !refuse_listen) else {
        state
            .server
            .record(json!({"method": req.method().as_str(), "refused": 401, "headers": headers}));
        return Some(challenge(StatusCode::UNAUTHORIZED, None, &args.oauth_scope));
    };
    let scopes: Vec<&str> = claims.scope.split_whitespace().collect();
    if !scopes.contains(&args.oauth_scope.as_str()) {
        return Some(challenge(
            StatusCode::FORBIDDEN,
            Some("insufficient_scope"),
            &args.oauth_scope,
        ));
    }
    headers.insert("x-demo-subject".into(), claims.sub.clone());
    headers.insert("x-demo-scopes".into(), claims.scope.clone());
    None
}

/// `--oauth-tool-scope`: the 403 for a tool whose scope the token lacks.
fn tool_scope_refusal(
    state: &State,
    request: &Request,
    headers: &BTreeMap<String, String>,
) -> Option<HttpResponse> {
    let args = &state.server.args;
    args.oauth_issuer.as_ref()?;
    if request.method != "tools/call" {
        return None;
    }
    let tool = request.params.as_ref()?.get("name")?.as_str()?;
    let needed = args
        .oauth_tool_scope
        .iter()
        .filter_map(|t| t.split_once('='))
        .find(|(t, _)| *t == tool)
        .map(|(_, s)| s)?;
    let granted = headers
        .get("x-demo-scopes")
        .map(String::as_str)
        .unwrap_or("");
    if granted.split_whitespace().any(|s| s == needed) {
        return None;
    }
    state
        .server
        .record(json!({"method": "tools/call", "refused": 403, "tool": tool}));
    let mut r = full(StatusCode::FORBIDDEN, "", "");
    let c = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{needed}\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
        origin(state, headers)
    );
    if let Ok(v) = c.parse() {
        r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, v);
    }
    Some(r)
}

/// One POST: a request, a notification, or a response to one of our requests.
async fn post(
    state: Arc<State>,
    req: hyper::Request<Incoming>,
    headers: BTreeMap<String, String>,
    session_id: Option<String>,
    known_session: Option<bool>,
) -> HttpResponse {
    if let Some(response) = forced_reply(&state.server.args) {
        state
            .server
            .record(json!({"method": "POST", "headers": headers}));
        return response;
    }
    let accept = headers.get("accept").cloned().unwrap_or_default();
    if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
        return full(
            StatusCode::NOT_ACCEPTABLE,
            "",
            "Accept must list application/json and text/event-stream",
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return full(StatusCode::PAYLOAD_TOO_LARGE, "", "body too large");
        }
        Err(_) => return full(StatusCode::BAD_REQUEST, "", "unreadable body"),
    };
    let message = match Message::parse(&body) {
        Ok(m) => m,
        Err(e) => {
            let error = Message::Response(Response {
                id: None,
                outcome: Err(RpcError::new(PARSE_ERROR, e.to_string())),
            });
            return json_message(StatusCode::BAD_REQUEST, &error);
        }
    };
    let request = match message {
        Message::Request(r) => r,
        Message::Notification(n) => {
            state
                .server
                .record(json!({"notification": n.method, "params": n.params, "headers": headers}));
            let delay = state.server.args.initialized_delay_ms;
            if n.method == "notifications/initialized"
                && delay > 0
                && state.next_session.load(Ordering::Relaxed) > 1
            {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            return full(StatusCode::ACCEPTED, "", "");
        }
        Message::Response(Response {
            id: Some(id),
            outcome,
        }) => {
            state
                .server
                .record(json!({"answer": id, "headers": headers}));
            let hold = state.server.args.hold_answers_ms;
            if hold > 0 {
                tokio::time::sleep(Duration::from_millis(hold)).await;
            }
            if let Some(pending) = session_id
                .as_ref()
                .and_then(|s| state.sessions.lock().get(s).map(|s| s.pending.clone()))
            {
                Peer::deliver(&pending, &id, outcome);
            }
            return full(StatusCode::ACCEPTED, "", "");
        }
        Message::Response(_) => return full(StatusCode::ACCEPTED, "", ""),
    };
    if let Some(refusal) = tool_scope_refusal(&state, &request, &headers) {
        if let Some(ms) = state.server.args.oauth_refusal_delay_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        return refusal;
    }
    let (unavailable, silent) = (
        state.server.args.unavailable_listens,
        state.server.args.silent_listens,
    );
    if request.method == "subscriptions/listen" && unavailable + silent > 0 {
        let n = state.server.listens_begun.fetch_add(1, Ordering::SeqCst);
        if (1..=unavailable).contains(&n) {
            state
                .server
                .record(json!({"method": request.method, "id": request.id, "status": 503}));
            return full(StatusCode::SERVICE_UNAVAILABLE, "", "");
        }
        if (unavailable + 1..=unavailable + silent).contains(&n) {
            state
                .server
                .record(json!({"method": request.method, "id": request.id, "status": "held"}));
            // Until the client gives up on it (and the connection with it).
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return full(StatusCode::SERVICE_UNAVAILABLE, "", "");
        }
    }
    let era = state.server.args.era;
    if request.method == "server/discover" {
        let args = &state.server.args;
        if let Some(status) = args.discover_status {
            state
                .server
                .record(json!({"method": request.method, "id": request.id, "status": status}));
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = full(code, "", "");
            if status == 401
                && let Ok(v) = "Bearer realm=\"demo\"".parse()
            {
                r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, v);
            }
            return r;
        }
        if args.discover_html {
            return full(
                StatusCode::OK,
                "text/html",
                "<html><body>Welcome</body></html>",
            );
        }
    }
    if request.method == "initialize" && era != ServeEra::Modern {
        return initialize(&state, request, headers).await;
    }
    let legacy = known_session == Some(true);
    if legacy
        && request.method == "tools/call"
        && state.server.args.expire_on_first_call
        && !state.server.expired_on_call.swap(true, Ordering::SeqCst)
        && let Some(session) = &session_id
    {
        state.sessions.lock().remove(session);
        let record = json!({"method": request.method, "id": request.id, "status": 404});
        state.server.record(record);
        return full(StatusCode::NOT_FOUND, "", "unknown session");
    }
    if era == ServeEra::Legacy && !legacy && request.method != "server/discover" {
        let error = RpcError::new(-32600, "Bad Request: no valid session ID");
        return json_message(
            StatusCode::BAD_REQUEST,
            &Message::Response(Response {
                id: Some(request.id),
                outcome: Err(error),
            }),
        );
    }
    let (pending, broadcast) = match session_id.as_ref().and_then(|s| {
        state.sessions.lock().get(s).map(|s| {
            let open = s.streams.iter().rev().find(|t| !t.is_closed());
            (s.pending.clone(), open.cloned())
        })
    }) {
        Some((pending, stream)) => (pending, stream.map(|tx| Peer::new(tx, Pending::default()))),
        None => (Pending::default(), None),
    };
    let tool = request
        .params
        .as_ref()
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let streaming = state.server.args.sse
        || request.method == "subscriptions/listen"
        || (request.method == "tools/call" && tools::STREAMING_TOOLS.contains(&tool));
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let ctx = Ctx {
        peer: Peer::new(out_tx.clone(), pending),
        legacy,
        headers,
        broadcast,
    };
    state.server.log(&request, &ctx);
    if streaming {
        return stream_reply(state, request, ctx, out_tx, out_rx, session_id);
    }
    drop(out_rx);
    json_reply(state, request, ctx, session_id).await
}

/// `--status-all`, `--content-type-all` and `--redirect-to`: the same answer to every
/// POST.
fn forced_reply(args: &DemoServerArgs) -> Option<HttpResponse> {
    if let Some(content_type) = &args.content_type_all {
        return Some(full(StatusCode::OK, content_type, "{}"));
    }
    if let Some(status) = args.status_all {
        let mut r = full(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "",
            "",
        );
        if status == 401
            && let Ok(v) = "Bearer realm=\"demo\"".parse()
        {
            r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, v);
        }
        return Some(r);
    }
    let to = args.redirect_to.as_ref()?;
    let mut r = full(StatusCode::TEMPORARY_REDIRECT, "", "");
    if let Ok(v) = to.parse() {
        r.headers_mut().insert(hyper::header::LOCATION, v);
    }
    Some(r)
}

/// Answers on an event stream (tools that send messages before their result).
fn stream_reply(
    state: Arc<State>,
    request: Request,
    ctx: Ctx,
    out_tx: mpsc::UnboundedSender<Out>,
    out_rx: mpsc::UnboundedReceiver<Out>,
    session_id: Option<String>,
) -> HttpResponse {
    let id = request.id.clone();
    {
        let (server, state2, sid) = (state.server.clone(), state.clone(), session_id.clone());
        tokio::spawn(async move {
            let action = server.handle(request, ctx).await;
            match action {
                Action::Reply(outcome) => {
                    let _ = out_tx.send(Out::Message(Message::Response(Response {
                        id: Some(id),
                        outcome,
                    })));
                }
                Action::EndlessStream | Action::NoReply => {
                    // Hold the stream open, answering nothing, until the client leaves.
                    while !out_tx.is_closed() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Action::Exit(code) => std::process::exit(code),
                Action::RawLine(text) => {
                    let id = serde_json::to_string(&id).unwrap_or_default();
                    let _ = out_tx.send(Out::Raw(text.replace("{id}", &id).into_bytes()));
                }
                Action::BrokenStream { then_exit, polls } => {
                    if then_exit {
                        // Gone before the client resumes (it waits the stream's retry,
                        // a second): its GET finds nothing listening.
                        tokio::spawn(async {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            std::process::exit(3);
                        });
                    }
                    // End the stream without the response; keep it for the resumption.
                    let ok = Ok(
                        json!({"content": [{"type": "text", "text": "resumed"}], "isError": false}),
                    );
                    let message = Message::Response(Response {
                        id: Some(id),
                        outcome: ok,
                    });
                    if let Some(sid) = &sid
                        && let Some(session) = state2.sessions.lock().get_mut(sid)
                    {
                        session.resume = Some(message);
                        session.polls = polls;
                    }
                }
                other => {
                    let resp = other_to_result(other, &state2, sid.as_deref());
                    let _ = out_tx.send(Out::Message(Message::Response(Response {
                        id: Some(id),
                        outcome: resp,
                    })));
                }
            }
        });
    }
    sse_response(pump_sse(out_rx))
}

/// Answers with one JSON body (or the HTTP-level fault the tool asks for).
async fn json_reply(
    state: Arc<State>,
    request: Request,
    ctx: Ctx,
    session_id: Option<String>,
) -> HttpResponse {
    let id = request.id.clone();
    let action = state.server.handle(request, ctx).await;
    match action {
        Action::Reply(outcome) => reply_status(id, outcome),
        Action::NoReply => std::future::pending().await,
        Action::Garbage => full(StatusCode::OK, "application/json", "this is {not json"),
        Action::RawLine(text) | Action::RawThenExit(text) => {
            let body = text.replace("{id}", &serde_json::to_string(&id).unwrap_or_default());
            full(StatusCode::OK, "application/json", body)
        }
        Action::Oversize(bytes) => {
            let result = json!({"content": [{"type": "text", "text": "x".repeat(bytes)}]});
            json_message(
                StatusCode::OK,
                &Message::Response(Response {
                    id: Some(id),
                    outcome: Ok(result),
                }),
            )
        }
        Action::Exit(code) => std::process::exit(code),
        Action::HttpStatus(status) => full(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "",
            "",
        ),
        Action::WrongContentType => full(StatusCode::OK, "text/html", "<html>not MCP</html>"),
        Action::Redirect(to) => {
            let mut r = full(StatusCode::TEMPORARY_REDIRECT, "", "");
            if let Ok(v) = to.parse() {
                r.headers_mut().insert(hyper::header::LOCATION, v);
            }
            r
        }
        Action::EndlessStream => {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                while tx.send(Bytes::from_static(b": keep-alive\n\n")).is_ok() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
            sse_response(rx)
        }
        other => reply_status(id, other_to_result(other, &state, session_id.as_deref())),
    }
}

/// The result of the actions that have no HTTP-specific form.
fn other_to_result(
    action: Action,
    state: &State,
    session: Option<&str>,
) -> Result<Value, RpcError> {
    if let (Action::ExpireSession, Some(s)) = (&action, session) {
        state.sessions.lock().remove(s);
    }
    Ok(json!({"content": [{"type": "text", "text": "done"}], "isError": false}))
}

/// A JSON reply with the status a modern server uses for it.
fn reply_status(id: RequestId, outcome: Result<Value, RpcError>) -> HttpResponse {
    let status = match &outcome {
        Err(e) if (-32022..=-32020).contains(&e.code) => StatusCode::BAD_REQUEST,
        Err(e) if e.code == -32602 && e.message.contains("_meta") => StatusCode::BAD_REQUEST,
        Err(e) if e.code == METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    };
    json_message(
        status,
        &Message::Response(Response {
            id: Some(id),
            outcome,
        }),
    )
}

async fn initialize(
    state: &Arc<State>,
    request: Request,
    headers: BTreeMap<String, String>,
) -> HttpResponse {
    let n = state.next_session.fetch_add(1, Ordering::Relaxed);
    if n > 0 {
        let delay = state.server.args.renewal_delay_ms;
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    let sid = format!("demo-session-{}-{n}", std::process::id());
    if n > 0 && state.server.args.renewal_reply_stalls {
        // The session begins, and its stream stays open with nothing on it.
        let (tx, rx) = mpsc::unbounded_channel();
        let mut session = Session::default();
        session.streams.push(tx);
        state.sessions.lock().insert(sid.clone(), session);
        let mut response = sse_response(pump_sse(rx));
        if let Ok(v) = sid.parse() {
            response.headers_mut().insert("mcp-session-id", v);
        }
        return response;
    }
    if state.server.args.ping_before_initialize {
        // The session begins with the reply's headers, before its result: the ping on
        // the reply's stream is answered in it (an answer without the id reaches nothing).
        let session = Session::default();
        let pending = session.pending.clone();
        state.sessions.lock().insert(sid.clone(), session);
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let ctx = Ctx {
            peer: Peer::new(out_tx.clone(), pending),
            legacy: true,
            headers,
            broadcast: None,
        };
        state.server.log(&request, &ctx);
        let mut response = stream_reply(
            state.clone(),
            request,
            ctx,
            out_tx,
            out_rx,
            Some(sid.clone()),
        );
        if let Ok(v) = sid.parse() {
            response.headers_mut().insert("mcp-session-id", v);
        }
        return response;
    }
    let ctx = Ctx {
        peer: Peer::new(mpsc::unbounded_channel().0, Pending::default()),
        legacy: true,
        headers,
        broadcast: None,
    };
    state.server.log(&request, &ctx);
    let id = request.id.clone();
    let refuse = state.server.args.refuse_initialize_with_session;
    let refused_renewal = state.server.args.refuse_renewal_code.filter(|_| n > 0);
    let outcome = if refuse {
        Err(RpcError::new(
            INTERNAL_ERROR,
            "initialize refused (--refuse-initialize-with-session)",
        ))
    } else if let Some(code) = refused_renewal {
        Err(RpcError::new(
            code,
            "initialize refused (--refuse-renewal-code)",
        ))
    } else {
        let Action::Reply(mut outcome) = state.server.handle(request, ctx).await else {
            return full(StatusCode::INTERNAL_SERVER_ERROR, "", "");
        };
        if let (true, Some(version), Ok(result)) =
            (n > 0, &state.server.args.renewal_version, &mut outcome)
        {
            result["protocolVersion"] = version.as_str().into();
        }
        outcome
    };
    let ok = outcome.is_ok() || refuse;
    let mut response = json_message(
        StatusCode::OK,
        &Message::Response(Response {
            id: Some(id),
            outcome,
        }),
    );
    if ok {
        state
            .sessions
            .lock()
            .insert(sid.clone(), Session::default());
        if let Ok(v) = sid.parse() {
            response.headers_mut().insert("mcp-session-id", v);
        }
    }
    response
}

/// What a 2026-07-28 server checks of the headers: they must repeat the body.
pub fn check_headers(
    request: &Request,
    version: &str,
    headers: &BTreeMap<String, String>,
    catalog: &[Value],
) -> Result<(), RpcError> {
    let mismatch = |what: &str| {
        Err(RpcError::new(
            HEADER_MISMATCH,
            format!("header mismatch: {what}"),
        ))
    };
    if headers.get("mcp-protocol-version").map(String::as_str) != Some(version) {
        return mismatch("MCP-Protocol-Version");
    }
    if headers.get("mcp-method") != Some(&request.method) {
        return mismatch("Mcp-Method");
    }
    if let Some(name) = mcp_name(&request.method, request.params.as_ref())
        && headers.get("mcp-name") != Some(&name)
    {
        return mismatch("Mcp-Name");
    }
    if request.method == "tools/call" {
        let params = request.params.as_ref();
        let tool = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let arguments = params
            .and_then(|p| p.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null);
        let schema = catalog
            .iter()
            .find(|t| t["name"] == tool)
            .map(|t| t["inputSchema"].clone());
        for h in schema
            .and_then(|s| param_headers(&s).ok())
            .unwrap_or_default()
        {
            let expected = param_value(&arguments, &h.path);
            let got = headers.get(&format!("mcp-param-{}", h.name.to_ascii_lowercase()));
            if expected.as_ref() != got {
                return mismatch(&format!("Mcp-Param-{}", h.name));
            }
        }
    }
    Ok(())
}
