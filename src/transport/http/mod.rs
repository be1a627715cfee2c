//! The Streamable HTTP transport: one POST per message to one endpoint (reqwest).
//!
//! Every POST carries `Accept: application/json, text/event-stream`, the
//! `MCP-Protocol-Version` of its body's `_meta` (or the legacy session's version),
//! `Mcp-Method`, `Mcp-Name` where the method has one, and the `Mcp-Param-*` headers the
//! connection computed from the tool's schema. A reply is either one JSON body or an SSE
//! stream for that request; on a stream, notifications (and, from legacy servers,
//! requests) before the response go to the inbound channel, and reading stops as soon
//! as the response arrives. Every reply is bounded in size.
//!
//! Cancellation and timeout drop the response stream, which closes the request's
//! HTTP connection: that is how 2026-07-28 cancels on HTTP.
//!
//! Legacy servers (2025-06-18, 2025-11-25) also get: the `Mcp-Session-Id` from the
//! `initialize` reply on every later message, [`TransportError::SessionExpired`] on a
//! 404 so the connection can re-initialize, the standalone GET stream (reconnected with
//! `Last-Event-ID` after the server's `retry` delay), resumption of a broken POST stream
//! the same way, responses to server requests POSTed back, and a DELETE of the session
//! on shutdown.
//!
//! Status mapping: 401/403 → [`TransportError::Unauthorized`]; another status with a
//! JSON-RPC error body → that error (the era probe needs it); 5xx and the rest →
//! [`TransportError::HttpStatus`]; a refused connection → [`TransportError::NotSent`].
//! Spec: section F, and H for the legacy session.

pub mod headers;
pub mod sse;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Inbound;
use super::error::TransportError;
use crate::protocol::meta::requested_version;
use crate::protocol::{Message, Notification, Request, RequestId, Response, RpcError};
use sse::SseParser;

/// What an HTTP server is: its MCP endpoint and any fixed headers (for example
/// `Authorization`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSpec {
    /// The single MCP endpoint.
    pub url: String,
    /// Headers sent on every request.
    pub headers: BTreeMap<String, String>,
}

type Reply = Result<Value, RpcError>;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// How often a broken legacy stream is resumed before the request fails.
const MAX_RESUMES: usize = 3;

#[derive(Default)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

/// A connected Streamable HTTP server.
pub struct HttpTransport {
    server: String,
    client: reqwest::Client,
    url: reqwest::Url,
    fixed: HeaderMap,
    max_body: usize,
    session: Arc<Mutex<Session>>,
    inbound: mpsc::Sender<Inbound>,
    get_stream: Mutex<Option<JoinHandle<()>>>,
}

impl HttpTransport {
    /// Prepares a transport for `spec`; nothing is sent until the first request.
    pub(crate) fn new(
        server: &str,
        spec: &HttpSpec,
        max_body: usize,
        inbound: mpsc::Sender<Inbound>,
    ) -> Result<HttpTransport, TransportError> {
        let bad =
            |what: String| TransportError::NotSent(format!("invalid HTTP server config: {what}"));
        let url =
            reqwest::Url::parse(&spec.url).map_err(|e| bad(format!("url {:?}: {e}", spec.url)))?;
        let mut fixed = HeaderMap::new();
        for (k, v) in &spec.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| bad(format!("header {k:?}: {e}")))?;
            let value =
                HeaderValue::from_str(v).map_err(|e| bad(format!("header {k:?} value: {e}")))?;
            fixed.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(HttpTransport {
            server: server.to_string(),
            client,
            url,
            fixed,
            max_body,
            session: Arc::new(Mutex::new(Session::default())),
            inbound,
            get_stream: Mutex::new(None),
        })
    }

    fn post(
        &self,
        body: Vec<u8>,
        method: &str,
        params: Option<&Value>,
        version: Option<&str>,
        extra: &[(HeaderName, HeaderValue)],
    ) -> reqwest::RequestBuilder {
        let mut headers = self.fixed.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let session = self.session.lock();
        if let Some(v) = version
            .or(session.version.as_deref())
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert(VERSION_HEADER, v);
        }
        if let Some(id) = session
            .id
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert(SESSION_HEADER, id);
        }
        drop(session);
        if !method.is_empty()
            && let Ok(m) = HeaderValue::from_str(method)
        {
            headers.insert("mcp-method", m);
        }
        if let Some(name) =
            headers::mcp_name(method, params).and_then(|n| HeaderValue::from_str(&n).ok())
        {
            headers.insert("mcp-name", name);
        }
        for (k, v) in extra {
            headers.insert(k.clone(), v.clone());
        }
        self.client
            .post(self.url.clone())
            .headers(headers)
            .body(body)
    }

    /// Sends a request and reads its reply, within `timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future drops the reply stream, which cancels the request.
    pub(crate) async fn request(
        &self,
        request: &Request,
        extra: &[(HeaderName, HeaderValue)],
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        let version = requested_version(request.params.as_ref()).map(String::from);
        let is_initialize = request.method == "initialize";
        let id = &request.id;
        let exchange = async {
            let body = Message::request_json(request);
            let response = self
                .post(
                    body,
                    &request.method,
                    request.params.as_ref(),
                    version.as_deref(),
                    extra,
                )
                .send()
                .await
                .map_err(send_error)?;
            if is_initialize {
                // The legacy session starts with the initialize reply.
                let sid = response
                    .headers()
                    .get(SESSION_HEADER)
                    .and_then(|v| v.to_str().ok());
                self.session.lock().id = sid.map(String::from);
            }
            self.read_reply(response, id).await
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(TransportError::Timeout(timeout)))
    }

    async fn read_reply(
        &self,
        response: reqwest::Response,
        id: &RequestId,
    ) -> Result<Reply, TransportError> {
        let status = response.status();
        let content_type = content_type(&response);
        if status.as_u16() == 401 || status.as_u16() == 403 {
            return Err(TransportError::Unauthorized {
                status: status.as_u16(),
            });
        }
        if status.as_u16() == 404 && self.session.lock().id.is_some() {
            return Err(TransportError::SessionExpired);
        }
        if !status.is_success() {
            let body = read_body(response, self.max_body).await.unwrap_or_default();
            // A JSON-RPC error body says more than the status (-32022 carries
            // `data.supported`; the era probe classifies on it).
            if let Ok(Message::Response(Response {
                outcome: Err(e), ..
            })) = Message::parse(&body)
            {
                return Ok(Err(e));
            }
            return Err(TransportError::HttpStatus {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
            });
        }
        if content_type.starts_with("application/json") {
            let body = read_body(response, self.max_body).await?;
            return match Message::parse(&body)? {
                Message::Response(r) if r.id.as_ref() == Some(id) || r.id.is_none() => {
                    Ok(r.outcome)
                }
                other => Err(crate::protocol::ProtocolError::Malformed(format!(
                    "expected the response to request {id}, got {}",
                    other.to_value()
                ))
                .into()),
            };
        }
        if content_type.starts_with("text/event-stream") {
            return self.read_stream(response, id).await;
        }
        Err(TransportError::UnexpectedContentType(content_type))
    }

    /// Reads an SSE reply until the response to `id`, resuming a broken legacy stream.
    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        id: &RequestId,
    ) -> Result<Reply, TransportError> {
        let mut parser = SseParser::default();
        let mut resumes = 0;
        loop {
            if let Some(reply) = self.pump(&mut response, &mut parser, Some(id)).await? {
                return Ok(reply);
            }
            // The stream ended without our response. Only a legacy session may resume it.
            let can_resume = self.session.lock().id.is_some() && parser.last_event_id.is_some();
            if !can_resume || resumes >= MAX_RESUMES {
                return Err(TransportError::StreamEnded);
            }
            resumes += 1;
            tokio::time::sleep(parser.retry.unwrap_or(DEFAULT_RETRY)).await;
            response = self
                .get(parser.last_event_id.as_deref())
                .send()
                .await
                .map_err(send_error)?;
            if !response.status().is_success() {
                return Err(TransportError::StreamEnded);
            }
        }
    }

    /// Dispatches events until the response to `want` arrives (returned) or the stream
    /// ends (`None`).
    async fn pump(
        &self,
        response: &mut reqwest::Response,
        parser: &mut SseParser,
        want: Option<&RequestId>,
    ) -> Result<Option<Reply>, TransportError> {
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %e, "event stream broke");
                    return Ok(None);
                }
            };
            let events = parser
                .feed(&chunk, self.max_body)
                .map_err(|limit| TransportError::ResponseTooLarge { limit })?;
            for event in events {
                if event.data.trim().is_empty() {
                    continue; // priming events carry only an id
                }
                match Message::parse(event.data.as_bytes()) {
                    Ok(Message::Response(r)) if want.is_some() && r.id.as_ref() == want => {
                        return Ok(Some(r.outcome));
                    }
                    Ok(Message::Response(r)) => {
                        tracing::warn!(server = %self.server, id = ?r.id, "response for another request on an event stream ignored");
                    }
                    Ok(Message::Request(r)) => {
                        let _ = self.inbound.send(Inbound::Request(r)).await;
                    }
                    Ok(Message::Notification(n)) => {
                        let _ = self.inbound.send(Inbound::Notification(n)).await;
                    }
                    Err(e) => {
                        tracing::warn!(server = %self.server, error = %e, "skipping an event that is not JSON-RPC");
                    }
                }
            }
        }
    }

    fn get(&self, last_event_id: Option<&str>) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .get(self.url.clone())
            .headers(self.fixed.clone())
            .header(ACCEPT, "text/event-stream");
        let session = self.session.lock();
        if let Some(id) = &session.id {
            req = req.header(SESSION_HEADER, id);
        }
        if let Some(v) = &session.version {
            req = req.header(VERSION_HEADER, v);
        }
        if let Some(last) = last_event_id {
            req = req.header("last-event-id", last);
        }
        req
    }

    /// Sends a notification (legacy only: modern HTTP has no client notifications).
    pub(crate) async fn notify(
        &self,
        notification: Notification,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.post_no_reply(Message::Notification(notification), timeout)
            .await
    }

    /// POSTs the answer to a request a legacy server sent.
    pub(crate) async fn respond(
        &self,
        id: RequestId,
        outcome: Reply,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.post_no_reply(
            Message::Response(Response {
                id: Some(id),
                outcome,
            }),
            timeout,
        )
        .await
    }

    async fn post_no_reply(
        &self,
        message: Message,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let (method, params) = match &message {
            Message::Notification(n) => (n.method.as_str(), n.params.as_ref()),
            _ => ("", None),
        };
        let mut body = Vec::with_capacity(128);
        message.write_json(&mut body);
        let send = async {
            let response = self
                .post(body, method, params, None, &[])
                .send()
                .await
                .map_err(send_error)?;
            let status = response.status();
            match status.as_u16() {
                200..=299 => Ok(()),
                401 | 403 => Err(TransportError::Unauthorized {
                    status: status.as_u16(),
                }),
                404 if self.session.lock().id.is_some() => Err(TransportError::SessionExpired),
                code => Err(TransportError::HttpStatus {
                    status: code,
                    body: String::new(),
                }),
            }
        };
        tokio::time::timeout(timeout, send)
            .await
            .unwrap_or(Err(TransportError::Timeout(timeout)))
    }

    /// Records the version a legacy server chose; it goes on every later request.
    pub(crate) fn set_legacy_version(&self, version: &str) {
        self.session.lock().version = Some(version.to_string());
    }

    /// Forgets an expired legacy session before re-initializing.
    pub(crate) fn clear_session(&self) {
        self.session.lock().id = None;
    }

    /// Opens the legacy standalone GET stream, if the server offers one (405 means it
    /// does not), and keeps it open, resuming with `Last-Event-ID`.
    pub(crate) fn open_get_stream(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let mut parser = SseParser::default();
            loop {
                let Some(this) = weak.upgrade() else { return };
                let request = this.get(parser.last_event_id.as_deref());
                let mut response = match request.send().await {
                    Ok(r)
                        if r.status().is_success()
                            && content_type(&r).starts_with("text/event-stream") =>
                    {
                        r
                    }
                    Ok(r) => {
                        tracing::debug!(server = %this.server, status = %r.status(), "no standalone event stream");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(server = %this.server, error = %e, "standalone event stream failed");
                        return;
                    }
                };
                if let Err(e) = this.pump(&mut response, &mut parser, None).await {
                    tracing::warn!(server = %this.server, error = %e, "standalone event stream dropped");
                }
                let delay = parser.retry.unwrap_or(DEFAULT_RETRY);
                drop(this);
                tokio::time::sleep(delay).await;
            }
        });
        if let Some(old) = self.get_stream.lock().replace(task) {
            old.abort();
        }
    }

    /// Stops the legacy GET stream, if one is open.
    pub(crate) fn stop_get_stream(&self) {
        if let Some(task) = self.get_stream.lock().take() {
            task.abort();
        }
    }

    /// Ends the session: stops the GET stream and DELETEs a legacy session.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        if let Some(task) = self.get_stream.lock().take() {
            task.abort();
        }
        let sid = self.session.lock().id.take();
        if let Some(sid) = sid {
            let delete = self
                .client
                .delete(self.url.clone())
                .headers(self.fixed.clone())
                .header(SESSION_HEADER, sid);
            // 405 is allowed: the server does not let clients end sessions.
            let _ = tokio::time::timeout(timeout, delete.send()).await;
        }
    }
}

impl Drop for HttpTransport {
    fn drop(&mut self) {
        if let Some(task) = self.get_stream.lock().take() {
            task.abort();
        }
    }
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase()
}

fn send_error(e: reqwest::Error) -> TransportError {
    if e.is_connect() {
        TransportError::NotSent(format!("connection failed: {e}"))
    } else {
        TransportError::Network(e.to_string())
    }
}

async fn read_body(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, TransportError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| TransportError::Network(e.to_string()))?
    {
        if body.len() + chunk.len() > max {
            return Err(TransportError::ResponseTooLarge { limit: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
