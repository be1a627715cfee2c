//! The Streamable HTTP transport: one POST per message to one endpoint (reqwest).
//!
//! Every POST carries `Accept: application/json, text/event-stream`, the
//! `MCP-Protocol-Version` of its body's `_meta` (or the legacy session's version),
//! `Mcp-Method`, `Mcp-Name` where the method has one, and the `Mcp-Param-*` headers of
//! the tool's schema ([`params`]: learned from this connection's own `tools/list`,
//! read first when a `tools/call` comes before any listing, and again after a -32020).
//! A reply is either one JSON body or an SSE stream for that request; on a stream,
//! notifications (and, from legacy servers, requests) before the response go to the
//! inbound channel, and reading stops as soon as the response arrives. Every reply is
//! bounded in size.
//!
//! Redirects are never followed: a 3xx is [`TransportError::Redirect`]. Following one
//! would send the tool's arguments, configured API-key headers and the session id
//! wherever the server points. HTTPS uses rustls ([`tls`]); its failures are typed.
//!
//! Cancellation and timeout drop the response stream, which closes the request's
//! HTTP connection: that is how 2026-07-28 cancels on HTTP. A legacy session's request
//! also gets `notifications/cancelled` ([`CancelUnanswered`]). One deadline covers a
//! request with everything it takes (learning headers, renewing a session, retrying).
//!
//! Legacy servers (2025-06-18, 2025-11-25) also get ([`session`]): the
//! `Mcp-Session-Id` from the `initialize` reply on every later message, a new
//! `initialize` on a 404 (once for every request that saw it), the standalone GET
//! stream (reconnected with `Last-Event-ID` after the server's `retry` delay),
//! resumption of a broken POST stream the same way, responses to server requests
//! POSTed back, and a DELETE of the session on shutdown.
//!
//! Sign-in ([`crate::transport::auth`]): each request carries the bearer token of its
//! caller's auth context, if one is held (refreshed first when about to expire). A 401
//! renews or signs in and retries once; a 403 `insufficient_scope` asks for more scope
//! and retries, at most [`MAX_STEP_UPS`] times. The sign-in itself is not bounded by the
//! request's timeout (a person may be typing a password), but by its own.
//!
//! Status mapping: 401/403 → [`TransportError::Unauthorized`] (with the challenge); 3xx →
//! [`TransportError::Redirect`]; another status with a JSON-RPC error body → that error
//! (the era probe needs it); 5xx and the rest → [`TransportError::HttpStatus`]; a
//! refused connection → [`TransportError::NotSent`].
//! Spec: section F, and H for the legacy session.

pub mod headers;
mod params;
mod session;
pub mod sse;

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::auth::{
    AuthError, AuthFailure, AuthStep, Challenge, MAX_STEP_UPS, Renewal, SignIn, SignInContext,
};
use super::error::TransportError;
use super::inbound::{Ids, Inbound, InboundSink, Via};
use super::spec::HttpSpec;
use crate::protocol::error::HEADER_MISMATCH;
use crate::protocol::meta::requested_version;
use crate::protocol::views::InitializeResult;
use crate::protocol::{
    Message, Notification, Pager, Request, RequestId, RequestRef, Response, RpcError, Stamp,
};
use params::ParamTable;
use session::{PendingSession, Seen, Session};
use sse::{MAX_RETRY, MIN_RETRY, SseParser};

type Reply = Result<Value, RpcError>;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
/// How often in a row a broken legacy stream is resumed without an event before the
/// request fails (one that brought events counts none: a server may close at will).
const MAX_RESUMES: usize = 3;
/// A standalone event stream that stayed open this long is reopened after the
/// server's own `retry`; one that ended sooner, after twice the last wait.
const STREAM_LIVED: Duration = Duration::from_secs(10);
/// Most `tools/list` pages read to learn `Mcp-Param` annotations.
const MAX_LEARN_PAGES: usize = 100;

/// A connected Streamable HTTP server.
pub(crate) struct HttpTransport {
    server: String,
    client: reqwest::Client,
    url: reqwest::Url,
    fixed: HeaderMap,
    max_body: usize,
    ids: Ids,
    session: Session,
    params: ParamTable,
    inbound: InboundSink,
    get_stream: Mutex<Option<JoinHandle<()>>>,
    /// Shut down: a session renewal still under way gives up its new session.
    closed: std::sync::atomic::AtomicBool,
    /// An `initialize` was sent: the server speaks a legacy version (its requests are
    /// answered; a 2026-07-28 server's are not).
    legacy: std::sync::atomic::AtomicBool,
    /// Events not acted on (not JSON-RPC, replies to no request, requests dropped).
    ignored: crate::util::log_budget::LogBudget,
    sign_in: Arc<SignIn>,
    /// The longest a session renewal may take, whatever the request that began it has
    /// left (it goes on without that request): one request's default deadline.
    renewal_limit: Duration,
    this: Weak<HttpTransport>,
    /// Answers being sent to requests that found the inbound channel full.
    busy_answers: Arc<tokio::sync::Semaphore>,
    /// Ids requests in flight were sent again under (after a sign-in, a renewed
    /// session, annotations read again), each with the id the request was made with:
    /// the server's requests on a retry's stream came during the request as made.
    resent: parking_lot::Mutex<std::collections::HashMap<RequestId, RequestId>>,
}

/// An id a request was sent again under, in [`HttpTransport::resent`] until dropped.
struct Resent<'a> {
    transport: &'a HttpTransport,
    id: RequestId,
}

impl Drop for Resent<'_> {
    fn drop(&mut self) {
        self.transport.resent.lock().remove(&self.id);
    }
}

/// Answers to requests that found no room sent at once, at most.
const BUSY_ANSWERS: usize = 4;

impl HttpTransport {
    /// The id the request sent as `id` was made with.
    pub(super) fn made_as(&self, id: &RequestId) -> RequestId {
        self.resent
            .lock()
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.clone())
    }

    /// A new id for the request sent as `last` (or made as it), noted as the made
    /// one's until dropped.
    fn resend(&self, last: &RequestId) -> (RequestId, Resent<'_>) {
        let made = self.made_as(last);
        let id = self.ids.next();
        self.resent.lock().insert(id.clone(), made);
        let noted = Resent {
            transport: self,
            id: id.clone(),
        };
        (id, noted)
    }

    /// Prepares a transport for `spec`; nothing is sent until the first request.
    pub(crate) async fn new(
        server: &str,
        spec: &HttpSpec,
        max_body: usize,
        ids: Ids,
        inbound: InboundSink,
        sign_in: &SignInContext,
        renewal_limit: Duration,
    ) -> Result<Arc<HttpTransport>, TransportError> {
        let bad = TransportError::InvalidConfig;
        let url =
            // Not quoted: a `${VAR}` may have put a key in it.
            reqwest::Url::parse(&spec.url).map_err(|e| bad(format!("the url is not one: {e}")))?;
        let mut fixed = HeaderMap::new();
        for (k, v) in &spec.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| bad(format!("header {k:?}: {e}")))?;
            if crate::transport::spec::REPLACED_HEADERS.contains(&name.as_str()) {
                tracing::warn!(server, header = %name, "a configured header the transport sets to what MCP needs is ignored");
                continue;
            }
            let mut value =
                HeaderValue::from_str(v).map_err(|e| bad(format!("header {k:?} value: {e}")))?;
            // Configured headers are mostly keys: never indexed by HTTP/2's header
            // compression, nor shown by a header map's `Debug`.
            value.set_sensitive(true);
            fixed.insert(name, value);
        }
        // reqwest builds a TLS config for every client, plain HTTP included: always hand
        // it ours, so it never looks for a process-wide provider. A `ca_file` is read
        // off the async thread, within the bound of a request.
        let tls = super::tls::connection_config(spec.ca_file.as_deref(), renewal_limit)
            .await
            .map_err(|e| match e {
                super::tls::CaRead::Invalid(why) => bad(why),
                super::tls::CaRead::Late(bound) => TransportError::Timeout(bound),
            })?;
        let sign_in = SignIn::new(
            server,
            &url,
            spec.auth.clone(),
            sign_in.clone(),
            tls.clone(),
        )
        .map_err(bad)?;
        let client = super::client_builder(&url)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Arc::new_cyclic(|this| HttpTransport {
            server: server.to_string(),
            client,
            url,
            fixed,
            max_body,
            ids,
            session: Session::default(),
            params: ParamTable::default(),
            inbound,
            get_stream: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            legacy: std::sync::atomic::AtomicBool::new(false),
            ignored: Default::default(),
            sign_in,
            renewal_limit,
            this: this.clone(),
            busy_answers: Arc::new(tokio::sync::Semaphore::new(BUSY_ANSWERS)),
            resent: Default::default(),
        }))
    }

    fn post(
        &self,
        body: Vec<u8>,
        method: &str,
        params: Option<&Value>,
        version: Option<&str>,
        extra: &[(HeaderName, HeaderValue)],
        identity: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut headers = self.fixed.clone();
        self.authorize(&mut headers, identity);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let session_version = self.session.version();
        if let Some(v) = version
            .or(session_version.as_deref())
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert(VERSION_HEADER, v);
        }
        // `initialize` begins a session (a renewal's too): it carries none. An answer
        // (no method) goes to the session whose stream asked, one being begun included.
        let session = match method {
            "initialize" => None,
            "" => self.session.answering_id(),
            _ => self.session.id(),
        };
        if let Some(id) = session.and_then(|v| HeaderValue::from_str(&v).ok()) {
            headers.insert(SESSION_HEADER, id);
        }
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

    /// The bearer token of `identity`'s sign-in, if one is held.
    fn authorize(&self, headers: &mut HeaderMap, identity: Option<&str>) {
        if let Some(token) = self.sign_in.sendable(identity)
            && let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
    }

    /// Renews `identity`'s token first if it is due, for a request of no call (a stream
    /// opened again or resumed, an answer, a notification): as a call's
    /// request does, so that one sent after the token expired carries a fresh one, not
    /// none (which the server would refuse, and nothing would sign in again). Within
    /// `limit`; a failure is the request's to meet (its refusal).
    async fn renew_ahead(&self, identity: Option<&str>, limit: Duration) {
        let until = crate::util::duration::after(Instant::now(), limit);
        if let Err(e) = self.sign_in.bearer(identity, until).await {
            tracing::debug!(server = %self.server, error = %e, "renewing the token ahead of a request failed");
        }
    }

    /// Sends a request as `identity` (an auth context; `None` for the connection's own
    /// requests) and reads its reply; a refusal signs in (see the module docs) and
    /// retries. The tries, the refresh of a token before one and a sign-in between them
    /// share `timeout`, so a server that holds each try to its deadline and then refuses
    /// it gets one deadline in all, not one per try. A token request under way is let
    /// finish (it may overrun by its own limit); a sign-in the request stops waiting for
    /// goes on within its own limits (a person may be signing in), and a handshake waits
    /// it out.
    ///
    /// # Cancel safety
    /// Dropping the future drops the reply stream, which cancels the request (in a
    /// legacy session, with `notifications/cancelled` too).
    pub(crate) async fn request(
        &self,
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        timeout: Duration,
        identity: Option<&str>,
        sent_as: &mut RequestId,
    ) -> Result<Reply, TransportError> {
        let (mut signed_in, mut step_ups) = (false, 0);
        // A sign-in is waited for until the deadline, and goes on without the request
        // past it; a connection's handshake, which no caller waits on, waits it out (a
        // person may be signing in, within the sign-in's own limits).
        let deadline = (!matches!(request.method, "initialize" | "server/discover"))
            .then(|| crate::util::duration::after(Instant::now(), timeout));
        // A token held already (another process's) is tried once before renewing.
        let mut took_held = false;
        // A retry is the same request under a new id.
        let mut id = request.id.clone();
        let mut resent = Vec::new();
        let mut left = timeout;
        loop {
            if left.is_zero() {
                return Err(TransportError::Timeout(timeout));
            }
            let started = Instant::now();
            let request = RequestRef { id: &id, ..request };
            // A refresh is never cut off halfway, not even by dropping this future (a
            // rotated refresh token would be lost with it); its time counts against
            // the tries'.
            // Bounded by the deadline as a whole: discovery and lock waits on the way
            // to a refresh are the request's time too.
            let bearer = self
                .sign_in
                .bearer(identity, crate::util::duration::after(started, left));
            let Some(sent) = waited(bearer, deadline).await else {
                return Err(TransportError::Timeout(timeout));
            };
            let sent = match sent {
                Ok(sent) => sent,
                // Waited out another request's renewal: this request's deadline, not a
                // sign-in that failed (which a restart could not heal).
                Err(e)
                    if e.step == AuthStep::Refresh
                        && matches!(e.failure, AuthFailure::Timeout(_)) =>
                {
                    return Err(TransportError::Timeout(timeout));
                }
                Err(e) => return Err(TransportError::Auth(e)),
            };
            let budget = left.saturating_sub(started.elapsed());
            if budget.is_zero() {
                return Err(TransportError::Timeout(timeout));
            }
            let tried = self
                .try_request(request, stamp, budget, identity, sent_as)
                .await;
            left = left.saturating_sub(started.elapsed());
            if tried.is_ok() {
                self.sign_in.accepted(identity, sent.as_deref());
            }
            match tried {
                Err(TransportError::Unauthorized {
                    status: 401,
                    challenge,
                }) if !signed_in => {
                    let bearer = challenge.is_some();
                    let asked = challenge.clone().unwrap_or_default();
                    let renewal = self.sign_in.on_refused(
                        identity,
                        &asked,
                        sent.as_deref(),
                        false,
                        !took_held,
                    );
                    let Some(renewal) = waited(renewal, deadline).await else {
                        return Err(TransportError::Timeout(timeout));
                    };
                    left = left_after_sign_in(left, deadline);
                    match renewal {
                        Ok(Renewal::Held) => took_held = true,
                        Ok(Renewal::Renewed) => signed_in = true,
                        Ok(Renewal::Refused) => {
                            return Err(TransportError::Unauthorized {
                                status: 401,
                                challenge,
                            });
                        }
                        // No Bearer challenge and no resource metadata: this server
                        // does not do MCP authorization; its refusal is the answer.
                        Err(e) if !bearer && e.is_not_found() => {
                            return Err(TransportError::Unauthorized {
                                status: 401,
                                challenge,
                            });
                        }
                        Err(e) => {
                            return Err(TransportError::Auth(AuthError {
                                refused: Some(401),
                                ..e
                            }));
                        }
                    }
                }
                Err(TransportError::Unauthorized {
                    status: 403,
                    challenge: Some(challenge),
                }) if challenge.insufficient_scope() => {
                    if step_ups >= MAX_STEP_UPS {
                        return Err(TransportError::Auth(self.sign_in.scope_exhausted(step_ups)));
                    }
                    // Asked of the authorization server moments ago, and not granted:
                    // the server's refusal stands (a sign-in each request, else).
                    if step_ups == 0 && self.sign_in.step_up_denied(identity, &challenge) {
                        return Err(TransportError::Unauthorized {
                            status: 403,
                            challenge: Some(challenge),
                        });
                    }
                    step_ups += 1;
                    let renewal =
                        self.sign_in
                            .on_refused(identity, &challenge, sent.as_deref(), true, false);
                    let Some(renewal) = waited(renewal, deadline).await else {
                        return Err(TransportError::Timeout(timeout));
                    };
                    left = left_after_sign_in(left, deadline);
                    let renewal = renewal.map_err(|e| {
                        TransportError::Auth(AuthError {
                            refused: Some(403),
                            ..e
                        })
                    })?;
                    if renewal == Renewal::Refused {
                        return Err(TransportError::Unauthorized {
                            status: 403,
                            challenge: Some(challenge),
                        });
                    }
                }
                other => return other,
            }
            let (again, noted) = self.resend(request.id);
            resent.push(noted);
            sent_as.clone_from(&again);
            id = again;
        }
    }

    /// Whether `identity` holds a token.
    pub(crate) fn signed_in(&self, identity: Option<&str>) -> bool {
        self.sign_in.current(identity).is_some()
    }

    /// Forces a sign-in for `identity`.
    pub(crate) async fn sign_in(&self, identity: Option<&str>) -> Result<(), TransportError> {
        self.sign_in
            .sign_in(identity)
            .await
            .map_err(TransportError::Auth)
    }

    /// Forgets this server's tokens (the command line's `logout`); how many went.
    pub(crate) fn sign_out(&self) -> Result<usize, TransportError> {
        self.sign_in.sign_out().map_err(TransportError::Auth)
    }

    /// One try of a request, within `timeout` for everything it takes: reading the
    /// `Mcp-Param` annotations first, renewing an expired legacy session, re-reading the
    /// annotations after a -32020 (each retried once, with a new id, put in `sent_as`).
    async fn try_request(
        &self,
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        timeout: Duration,
        identity: Option<&str>,
        sent_as: &mut RequestId,
    ) -> Result<Reply, TransportError> {
        let deadline = crate::util::duration::after(Instant::now(), timeout);
        let work = async {
            if self.params.needs_learning(request) {
                self.learn_params(stamp, identity).await;
            }
            let (mut renewed, mut relearned) = (false, false);
            let mut id = request.id.clone();
            let made = self.made_as(request.id);
            let mut resent = Vec::new();
            let mut unanswered = CancelUnanswered {
                transport: self,
                id: None,
                identity,
            };
            loop {
                let request = RequestRef { id: &id, ..request };
                let extra = self.params.headers(request);
                let seen = self.session.seen();
                // Answered or refused, it needs no cancellation: only one left waiting.
                unanswered.id = (request.method != "initialize").then(|| id.clone());
                let exchanged = self.exchange(request, stamp, &extra, identity).await;
                unanswered.id = None;
                if exchanged.is_ok() {
                    // The session serves: renewals that failed before are not in a row.
                    self.session.served();
                }
                match exchanged {
                    Ok(Ok(mut result)) => {
                        if request.method == "tools/list" {
                            self.params.absorb(&self.server, &mut result);
                        }
                        return Ok(Ok(result));
                    }
                    Ok(Err(e))
                        if e.code == HEADER_MISMATCH
                            && request.method == "tools/call"
                            && !relearned =>
                    {
                        // The tool's x-mcp-header annotations may have changed.
                        relearned = true;
                        self.learn_params(stamp, identity).await;
                    }
                    Err(TransportError::SessionExpired) if !renewed => {
                        renewed = true;
                        self.renew_session(seen).await?;
                    }
                    other => return other,
                }
                let (again, noted) = self.resend(&made);
                resent.push(noted);
                sent_as.clone_from(&again);
                id = again;
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::Timeout(timeout)),
        }
    }

    /// POSTs `notifications/cancelled` for request `id` of a legacy session, as
    /// `identity`, on a task of its own (bounded by [`CANCEL_TIMEOUT`]).
    fn cancel_later(&self, id: RequestId, identity: Option<&str>) {
        let (Some(this), Ok(runtime)) =
            (self.this.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let identity = identity.map(str::to_string);
        runtime.spawn(async move {
            let cancelled = Message::Notification(Notification {
                method: "notifications/cancelled".into(),
                params: Some(serde_json::json!({
                    "requestId": id,
                    "reason": "the client stopped waiting",
                })),
            });
            let sent = this.post_no_reply(cancelled, &[], identity.as_deref());
            if let Ok(Err(e)) = tokio::time::timeout(CANCEL_TIMEOUT, sent).await {
                tracing::debug!(server = %this.server, error = %e, "notifications/cancelled not sent");
            }
        });
    }

    /// One POST and its reply. A legacy session starts with an `initialize` reply that
    /// names one (a renewal's takes its new id itself: [`Self::renew_now`]).
    async fn exchange(
        &self,
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        extra: &[(HeaderName, HeaderValue)],
        identity: Option<&str>,
    ) -> Result<Reply, TransportError> {
        if request.method == "initialize" {
            self.legacy.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        // Refused or not: a session the server began is held, so that the handshake's
        // failure, shutting the transport down, ends it.
        let adopt = request.method == "initialize" && !self.session.has_id();
        let (reply, _) = self
            .exchange_with_session(request, stamp, extra, identity, adopt)
            .await?;
        Ok(reply)
    }

    /// [`Self::exchange`], with the session id the reply came with. `adopt`: the id is
    /// this transport's from the reply's headers on, before its body is read (a server
    /// may ping on an `initialize` reply's stream, and the answer must name the session).
    async fn exchange_with_session(
        &self,
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        extra: &[(HeaderName, HeaderValue)],
        identity: Option<&str>,
        adopt: bool,
    ) -> Result<(Reply, Option<String>), TransportError> {
        let version = match &stamp {
            Some(s) => Some(s.version()),
            None => requested_version(request.params),
        };
        let body = Message::stamped_json(request, stamp);
        // The session the request goes in (`post` names the same): a broken reply
        // stream is resumed there or not at all.
        let sent_in = (request.method != "initialize")
            .then(|| self.session.id())
            .flatten();
        let response = self
            .post(
                body,
                request.method,
                request.params,
                version,
                extra,
                identity,
            )
            .send()
            .await
            .map_err(send_error)?;
        let sid = match response.headers().get(SESSION_HEADER) {
            None => None,
            Some(v) => {
                let usable = usable_session_id(v.as_bytes()).map(String::from);
                if usable.is_none()
                    && let Some(ignored) = self.ignored.log()
                {
                    tracing::warn!(server = %self.server, bytes = v.len(), ignored, "a session id that is not 1 to 1024 visible ASCII characters; taken for none");
                }
                usable
            }
        };
        // A session an `initialize` began is ended if its reply then fails, or is cut
        // off (its time ran out), rather than left to the server.
        let adopted = adopt && sid.is_some();
        let mut begun = Begun {
            transport: self.this.clone(),
            sid: sid.clone().filter(|_| request.method == "initialize"),
            adopted,
        };
        if adopted {
            self.session.set_id(sid.clone());
        }
        // A renewal's reply may ask (a ping) before the new session is in use: its
        // answers go to the new session, not the one that expired.
        let _pending = match (&sid, adopt, request.method) {
            (Some(new), false, "initialize") => Some(PendingSession::set(&self.session, new)),
            _ => None,
        };
        // An `initialize` reply is the session it began (adopted or pending).
        let resume_in = match request.method {
            "initialize" => sid.clone(),
            _ => sent_in,
        };
        let read = self
            .read_reply(response, request.id, identity, resume_in)
            .await;
        if read.is_ok() {
            begun.sid = None;
        }
        match read {
            Ok(reply) => Ok((reply, sid)),
            // An initialize carries no session: its 404 is no session expiring.
            Err(TransportError::SessionExpired) if request.method == "initialize" => {
                Err(TransportError::HttpStatus {
                    status: 404,
                    body: String::new(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the server's tool list over this connection (every page, within the
    /// caller's deadline) so that `tools/call` can carry the `Mcp-Param-*` headers its
    /// schemas ask for. A modern request's envelope goes on the listing too.
    async fn learn_params(&self, stamp: Option<Stamp<'_>>, identity: Option<&str>) {
        self.params.mark_listed();
        let mut cursor: Option<String> = None;
        let mut pager = Pager::new(MAX_LEARN_PAGES);
        loop {
            let listing = Request {
                id: self.ids.next(),
                method: "tools/list".into(),
                params: cursor.as_ref().map(|c| json!({ "cursor": c })),
            };
            let Ok(Ok(mut page)) = self.exchange((&listing).into(), stamp, &[], identity).await
            else {
                return;
            };
            self.params.absorb(&self.server, &mut page);
            match pager.next(&page) {
                Some(next) => cursor = Some(next),
                None => return,
            }
        }
    }

    /// Renews an expired legacy session, once for all the requests that saw it expire:
    /// a request whose session was already renewed just retries. Once begun, a renewal
    /// runs to its end (within `renewal_limit`, whatever is left of the
    /// request that began it) on a task of its own: cut off between its `initialize` and
    /// `initialized`, it would leave a session half begun.
    async fn renew_session(&self, seen: Seen) -> Result<(), TransportError> {
        let Some(init) = self.session.init_params() else {
            return Err(TransportError::SessionExpired);
        };
        let Some((renewing, first)) = self.session.start_renewal(seen).await else {
            return Ok(());
        };
        let Some(this) = self.this.upgrade() else {
            // Not reached: `&self` is borrowed from a live `Arc`.
            return Err(TransportError::SessionExpired);
        };
        let work = async move {
            let limit = this.renewal_limit;
            let renewal = this.renew_now(init);
            let renewed = match tokio::time::timeout(limit, renewal).await {
                Ok(renewed) => renewed,
                Err(_) => Err(renewal_failed(format!("no answer within {limit:?}"))),
            };
            // A failure that may pass is tried again at the next 404, but not forever: a
            // server that fails every renewal is one the connection cannot go on with.
            // Counted once for the requests that saw one expiry together: those that
            // waited for this renewal's turn try again, uncounted.
            let renewed = match renewed {
                Err(e) if !e.ends_connection() && !first => Err(e),
                Err(e) if !e.ends_connection() => match this.session.renewal_failed() {
                    n if n >= RENEWALS_FAILED_MAX => Err(TransportError::SessionRefused(format!(
                        "{n} renewals in a row failed, the last: {e}"
                    ))),
                    _ => Err(e),
                },
                other => other,
            };
            drop(renewing);
            renewed
        };
        match tokio::spawn(tracing::Instrument::in_current_span(work)).await {
            Ok(renewed) => renewed,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(renewal_failed("stopped with the runtime".into())),
        }
    }

    /// [`Self::renew_session`]'s work, as the session's own, as it began (the harness's
    /// sign-in, whichever request found it expired; a refusal fails the renewal, it is
    /// no refusal of that request's identity): `initialize`, then `initialized` on the
    /// new session, then its event stream. The old id stays until `initialized` is
    /// delivered: a renewal that fails or is cut off leaves a session that expires
    /// again (and is renewed again), and no request reaches a session not yet
    /// initialized.
    async fn renew_now(&self, init: Value) -> Result<(), TransportError> {
        let failed = renewal_failed;
        // Its request was answered 404 unread, and nothing will send it now: safe to
        // send elsewhere.
        let shut_down = || TransportError::NotSent("the connection was shut down".into());
        if self.is_closed() {
            return Err(shut_down());
        }
        // The session's token, refreshed first if it is due (as a request's is).
        let until = crate::util::duration::after(Instant::now(), self.renewal_limit);
        self.sign_in
            .bearer(None, until)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let refused = |e: TransportError| match e {
            TransportError::Unauthorized { status, .. } => TransportError::SessionRefused(format!(
                "the server refused the session's own sign-in ({status})"
            )),
            TransportError::SessionExpired => {
                TransportError::SessionRefused("the new session was gone at once".into())
            }
            other => other,
        };
        tracing::info!(server = %self.server, "HTTP session expired; initializing again");
        let request = Request {
            id: self.ids.next(),
            method: "initialize".into(),
            params: Some(init),
        };
        let (reply, sid) = self
            .exchange_with_session((&request).into(), None, &[], None, false)
            .await
            .map_err(refused)?;
        let checked = self.same_session(reply);
        let Some(sid) = sid else {
            return Err(checked.err().unwrap_or_else(|| {
                TransportError::SessionRefused("the reply began no session".into())
            }));
        };
        let Ok(header) = HeaderValue::from_str(&sid) else {
            return Err(TransportError::SessionRefused(
                "the session id is not a header value".into(),
            ));
        };
        // From here on, a session the server began is ended, not left to expire, if
        // this renewal fails or is cut off (its time ran out) before it is in use.
        let mut begun = Begun {
            transport: self.this.clone(),
            sid: Some(sid),
            adopted: false,
        };
        if let Err(e) = checked {
            self.end_session(begun.take(), SESSION_END_LIMIT).await;
            return Err(e);
        }
        if self.is_closed() {
            self.end_session(begun.take(), SESSION_END_LIMIT).await;
            return Err(shut_down());
        }
        let initialized = Notification {
            method: "notifications/initialized".into(),
            params: None,
        };
        let on_new = [(HeaderName::from_static(SESSION_HEADER), header)];
        if let Err(e) = self
            .post_no_reply(Message::Notification(initialized), &on_new, None)
            .await
        {
            self.end_session(begun.take(), SESSION_END_LIMIT).await;
            return Err(refused(e));
        }
        self.session.set_id(Some(begun.take()));
        if self.is_closed() {
            // Shut down meanwhile: whichever id shutdown took, this one is ended too.
            if let Some(sid) = self.session.take_id() {
                self.end_session(sid, SESSION_END_LIMIT).await;
            }
            return Err(shut_down());
        }
        self.session.renewed();
        self.open_get_stream();
        Ok(())
    }

    /// Whether a renewal's `initialize` reply begins the session as it was (the version
    /// it chose then), or why not. An error reply that refuses the request itself (the
    /// version, the params, the method: a server upgraded behind its address) is the
    /// server's refusal, which no renewal will change, as is a result that is no
    /// session as it was; any other error may be passing (a busy server), and is tried
    /// again at the next 404.
    fn same_session(&self, reply: Reply) -> Result<(), TransportError> {
        use crate::protocol::error::{
            INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, UNSUPPORTED_PROTOCOL_VERSION,
        };
        let refused = |why: String| TransportError::SessionRefused(why);
        let result = reply.map_err(|e| match e.code {
            UNSUPPORTED_PROTOCOL_VERSION | INVALID_PARAMS | INVALID_REQUEST | METHOD_NOT_FOUND => {
                refused(e.to_string())
            }
            _ => renewal_failed(e.to_string()),
        })?;
        let result = InitializeResult::from_value(&result).map_err(|e| refused(e.to_string()))?;
        if Some(&result.protocol_version) != self.session.version().as_ref() {
            return Err(refused(format!(
                "the server now chose version {:?}",
                crate::util::text::one_line(&result.protocol_version, 40)
            )));
        }
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// After `initialize`: the version the server chose (sent on every later request)
    /// and the params to renew the session with; opens the standalone GET stream.
    pub(crate) fn set_session_version(&self, version: &str) {
        self.session.set_version(version);
    }

    pub(crate) fn begin_legacy_session(&self, version: &str, init: Value) {
        self.session.begin(version, init);
        self.open_get_stream();
    }

    async fn read_reply(
        &self,
        response: reqwest::Response,
        id: &RequestId,
        identity: Option<&str>,
        session: Option<String>,
    ) -> Result<Reply, TransportError> {
        let status = response.status();
        let content_type = content_type(&response);
        if status.as_u16() == 401 || status.as_u16() == 403 {
            return Err(unauthorized(&response));
        }
        if status.is_redirection() {
            return Err(redirect(&response));
        }
        if status.as_u16() == 404 && self.session.has_id() {
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
                body: crate::util::text::one_line(
                    &String::from_utf8_lossy(&body[..body.len().min(300)]),
                    300,
                ),
            });
        }
        if content_type.starts_with("application/json") {
            let body = read_body(response, self.max_body).await?;
            return match Message::parse(&body)? {
                Message::Response(r) if r.id.as_ref() == Some(id) || r.id.is_none() => {
                    Ok(r.outcome)
                }
                _ => Err(crate::protocol::ProtocolError::Malformed(format!(
                    "expected the response to request {id}, got another message"
                ))
                .into()),
            };
        }
        if content_type.starts_with("text/event-stream") {
            return self.read_stream(response, id, identity, session).await;
        }
        // The server's text, in an error that reaches logs, records and clients.
        Err(TransportError::UnexpectedContentType(
            crate::util::text::one_line(&content_type, 100),
        ))
    }

    /// Reads an SSE reply until the response to `id`, resuming a broken legacy stream
    /// as `identity` (whose request it is: its token, not the harness's own) in
    /// `session`, the one the request went in.
    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        id: &RequestId,
        identity: Option<&str>,
        session: Option<String>,
    ) -> Result<Reply, TransportError> {
        let mut parser = SseParser::default();
        let mut resumes = 0;
        loop {
            let before = parser.dispatched;
            if let Some(reply) = self
                .pump(&mut response, &mut parser, Some(id), identity)
                .await?
            {
                return Ok(reply);
            }
            // A stream that gave events before it ended was not a failed resume: a
            // server may close its stream at will once it sent an id, and the client
            // polls with it (2025-11-25), however long the call runs.
            if parser.dispatched > before {
                resumes = 0;
            }
            // The stream ended without our response. Only a legacy session may resume it.
            let can_resume = session.is_some() && parser.last_event_id.is_some();
            if !can_resume || resumes >= MAX_RESUMES {
                return Err(TransportError::StreamEnded);
            }
            resumes += 1;
            tokio::time::sleep(parser.retry.unwrap_or(MIN_RETRY)).await;
            // Renewed meanwhile (another request's 404): the event ids are the old
            // session's, and resuming the new one from them could replay its events.
            // (A renewal's own reply is of the session it is beginning.)
            let now = self.session.id();
            if now != session && self.session.answering_id() != session {
                return Err(TransportError::StreamEnded);
            }
            // The request was delivered (its stream began): whatever fails now may
            // have run it, and must not pass for a request never sent (a call would go
            // to another server and run it twice).
            self.renew_ahead(identity, self.renewal_limit).await;
            response = self
                .get(
                    session.as_deref(),
                    parser.last_event_id.as_deref(),
                    identity,
                )
                .send()
                .await
                .map_err(|e| TransportError::Network(crate::util::text::http_failure(e)))?;
            if !response.status().is_success() {
                return Err(TransportError::StreamEnded);
            }
        }
    }

    /// Dispatches the events of one response's stream (a parser is kept across the
    /// streams of a request or a session, for resuming) until the response to `want`
    /// arrives (returned) or the stream ends (`None`). The server's requests on it are
    /// answered as `identity`, whose request's stream it is.
    async fn pump(
        &self,
        response: &mut reqwest::Response,
        parser: &mut SseParser,
        want: Option<&RequestId>,
        identity: Option<&str>,
    ) -> Result<Option<Reply>, TransportError> {
        parser.new_stream();
        let identity: Option<Arc<str>> = identity.map(Arc::from);
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %crate::util::text::http_failure(e), "event stream broke");
                    return Ok(None);
                }
            };
            // The events before one past the limit are read first: the awaited
            // response may be among them.
            let (events, fit) = parser.feed(&chunk, self.max_body);
            for event in events {
                if event.data.trim().is_empty() {
                    continue; // priming events carry only an id
                }
                match Message::parse(event.data.as_bytes()) {
                    // An error without an id on a request's own stream is that request's
                    // (as on a JSON reply): a server that could not read its id.
                    Ok(Message::Response(r))
                        if want.is_some()
                            && (r.id.as_ref() == want
                                || (r.id.is_none() && r.outcome.is_err())) =>
                    {
                        return Ok(Some(r.outcome));
                    }
                    Ok(Message::Response(r)) => {
                        if let Some(ignored) = self.ignored.log() {
                            let id = crate::util::text::one_line(&format!("{:?}", r.id), 100);
                            tracing::warn!(server = %self.server, %id, ignored, "response for another request on an event stream ignored");
                        }
                    }
                    Ok(Message::Request(r)) => {
                        let via = Via {
                            identity: identity.clone(),
                            during: want.map(|id| self.made_as(id)),
                        };
                        if let Err(Inbound::Request(r, via)) = self
                            .inbound
                            .offer(Inbound::Request(r, via), event.data.len())
                        {
                            self.refuse_busy(r.id, via.identity);
                        }
                    }
                    Ok(Message::Notification(n)) => {
                        if self
                            .inbound
                            .offer(Inbound::Notification(n), event.data.len())
                            .is_err()
                        {
                            tracing::debug!(server = %self.server, "server notification dropped: channel full");
                        }
                    }
                    Err(e) => {
                        // The reply awaited, but broken (an error of the wrong shape,
                        // say): the request fails now instead of at its deadline.
                        match Message::peek_id(event.data.as_bytes()) {
                            // A request whose id can be read hears an error under it
                            // (JSON-RPC asks for one), as a stdio server's does.
                            Some((id, true)) => self.refuse(
                                id,
                                crate::protocol::RpcError::new(e.code(), e.to_string()),
                                identity.clone(),
                            ),
                            // The reply awaited, but broken.
                            Some((id, false)) if want == Some(&id) => return Err(e.into()),
                            _ => {}
                        }
                        if let Some(ignored) = self.ignored.log() {
                            tracing::warn!(server = %self.server, error = %e, ignored, "skipping an event that is not JSON-RPC");
                        }
                    }
                }
            }
            fit.map_err(|limit| TransportError::ResponseTooLarge { limit })?;
        }
    }

    /// A GET of `session`'s event stream, as `identity` (`None`: the harness's own).
    fn get(
        &self,
        session: Option<&str>,
        last_event_id: Option<&str>,
        identity: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut headers = self.fixed.clone();
        self.authorize(&mut headers, identity);
        let mut req = self
            .client
            .get(self.url.clone())
            .headers(headers)
            .header(ACCEPT, "text/event-stream");
        if let Some(id) = session {
            req = req.header(SESSION_HEADER, id);
        }
        if let Some(v) = self.session.version() {
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
        let sent = async {
            self.renew_ahead(None, timeout).await;
            self.post_no_reply(Message::Notification(notification), &[], None)
                .await
        };
        tokio::time::timeout(timeout, sent)
            .await
            .unwrap_or(Err(TransportError::Timeout(timeout)))
    }

    /// POSTs the answer to a request a legacy server sent, as `identity` (the one whose
    /// request's stream carried it: that one's token, not the harness's own).
    pub(crate) async fn respond(
        &self,
        id: RequestId,
        outcome: Reply,
        timeout: Duration,
        identity: Option<&str>,
    ) -> Result<(), TransportError> {
        let message = Message::Response(Response {
            id: Some(id),
            outcome,
        });
        let sent = async {
            self.renew_ahead(identity, timeout).await;
            self.post_no_reply(message, &[], identity).await
        };
        tokio::time::timeout(timeout, sent)
            .await
            .unwrap_or(Err(TransportError::Timeout(timeout)))
    }

    /// Tells the server at once that its request `id` found no room (the inbound
    /// channel full), rather than leave it waiting for an answer that would never come:
    /// on a task of its own, at most [`BUSY_ANSWERS`] at once (past them it is dropped).
    fn refuse_busy(&self, id: RequestId, identity: Option<Arc<str>>) {
        if let Some(ignored) = self.ignored.log() {
            tracing::warn!(server = %self.server, ignored, "server request refused or dropped: channel full");
        }
        self.refuse(id, crate::transport::inbound::busy(), identity);
    }

    /// Answers a legacy server's request `id` with `error`, in the background, a few at
    /// a time (past them, not answered).
    fn refuse(&self, id: RequestId, error: crate::protocol::RpcError, identity: Option<Arc<str>>) {
        // No `initialize` sent: a 2026-07-28 server, to which a client never POSTs a
        // response (its request is a violation, dropped as the dispatcher drops it).
        if !self.legacy.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (Some(this), Ok(permit)) = (
            self.this.upgrade(),
            self.busy_answers.clone().try_acquire_owned(),
        ) else {
            return;
        };
        tokio::spawn(async move {
            let timeout = this.renewal_limit;
            let _ = this
                .respond(id, Err(error), timeout, identity.as_deref())
                .await;
            drop(permit);
        });
    }

    /// POSTs a message that has no reply, with `extra` headers (replacing any), as
    /// `identity`.
    async fn post_no_reply(
        &self,
        message: Message,
        extra: &[(HeaderName, HeaderValue)],
        identity: Option<&str>,
    ) -> Result<(), TransportError> {
        let (method, params) = match &message {
            Message::Notification(n) => (n.method.as_str(), n.params.as_ref()),
            _ => ("", None),
        };
        let mut body = Vec::with_capacity(128);
        message.write_json(&mut body);
        let response = self
            .post(body, method, params, None, extra, identity)
            .send()
            .await
            .map_err(send_error)?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => Ok(()),
            401 | 403 => Err(unauthorized(&response)),
            300..=399 => Err(redirect(&response)),
            404 if self.session.has_id() => Err(TransportError::SessionExpired),
            code => Err(TransportError::HttpStatus {
                status: code,
                body: String::new(),
            }),
        }
    }

    /// Opens the legacy standalone GET stream, if the server offers one (405 means it
    /// does not), and keeps it open, resuming with `Last-Event-ID`.
    fn open_get_stream(&self) {
        if self.is_closed() {
            return;
        }
        let weak = self.this.clone();
        let task = tokio::spawn(async move {
            let mut parser = SseParser::default();
            // Streams that end soon after they open are reopened less and less often
            // (up to a minute apart), and their failures logged now and then.
            let mut backoff = MIN_RETRY;
            let dropped = crate::util::log_budget::LogBudget::default();
            loop {
                let Some(this) = weak.upgrade().filter(|t| !t.is_closed()) else {
                    return;
                };
                let opened = Instant::now();
                // The session's own stream: the harness's own sign-in, renewed first if
                // due (the stream may be opened again long after the last request).
                this.renew_ahead(None, this.renewal_limit).await;
                let session = this.session.id();
                let sent = this.sign_in.sendable(None);
                let request = this.get(session.as_deref(), parser.last_event_id.as_deref(), None);
                // A server or proxy restarting (refused connections, 502, 503, 429) is
                // tried again, later and later; a server that has no stream, or refuses
                // this one, is not.
                let sent_get = tokio::time::timeout(this.renewal_limit, request.send()).await;
                let opened_stream = match sent_get {
                    // A server that takes the connection and never answers: a failure,
                    // tried again with the backoff, not a task parked for good.
                    Err(_) => Err(format!("no answer within {:?}", this.renewal_limit)),
                    Ok(sent_get) => match sent_get {
                        Ok(r)
                            if r.status().is_success()
                                && content_type(&r).starts_with("text/event-stream") =>
                        {
                            Ok(r)
                        }
                        Ok(r)
                            if matches!(r.status().as_u16(), 408 | 429 | 500 | 502 | 503 | 504) =>
                        {
                            Err(format!("HTTP {}", r.status().as_u16()))
                        }
                        // Refused: renewed (or signed in again) as a request's refusal is,
                        // and tried again; given up only when that cannot help.
                        Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => {
                            let challenge = match unauthorized(&r) {
                                TransportError::Unauthorized { challenge, .. } => challenge,
                                _ => None,
                            };
                            let renewed = this
                                .sign_in
                                .on_refused(
                                    None,
                                    &challenge.unwrap_or_default(),
                                    sent.as_deref(),
                                    false,
                                    true,
                                )
                                .await;
                            match renewed {
                                Ok(Renewal::Held | Renewal::Renewed) => {
                                    Err("HTTP 401; the token was renewed".into())
                                }
                                Ok(Renewal::Refused) | Err(_) => {
                                    tracing::warn!(server = %this.server, "the standalone event stream was refused and the token could not be renewed; server notifications are not received until the next session");
                                    return;
                                }
                            }
                        }
                        Ok(r) => {
                            tracing::debug!(server = %this.server, status = %r.status(), "no standalone event stream");
                            return;
                        }
                        Err(e) => Err(crate::util::text::http_failure(e)),
                    },
                };
                let pumped = match opened_stream {
                    Ok(mut response) => this.pump(&mut response, &mut parser, None, None).await,
                    Err(e) => {
                        tracing::debug!(server = %this.server, error = %e, "standalone event stream failed; trying again");
                        Err(TransportError::StreamEnded)
                    }
                };
                if let Err(e) = &pumped
                    && let Some(dropped) = dropped.log()
                {
                    tracing::warn!(server = %this.server, error = %e, dropped, "standalone event stream dropped");
                }
                let asked = parser.retry.unwrap_or(MIN_RETRY);
                backoff = if pumped.is_ok() && opened.elapsed() >= STREAM_LIVED {
                    asked
                } else {
                    backoff.saturating_mul(2).max(asked).min(MAX_RETRY)
                };
                drop(this);
                tokio::time::sleep(backoff).await;
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

    /// Marks the transport closed and stops the GET stream, its connection gone
    /// without a shutdown; the session held is ended in the background, not left to
    /// the server's expiry (an embedder that drops a `Connection` would leave one per
    /// connection).
    pub(crate) fn detach(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop_get_stream();
        self.end_held_session_later();
    }

    /// DELETEs the session held, if any, on a task of its own within
    /// [`SESSION_END_LIMIT`] (nothing without a runtime).
    fn end_held_session_later(&self) {
        let (Some(sid), Ok(runtime)) = (
            self.session.take_id(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let delete = self.delete_session(sid);
        runtime.spawn(async move {
            let _ = tokio::time::timeout(SESSION_END_LIMIT, delete.send()).await;
        });
    }

    /// Ends the session: stops the GET stream and DELETEs a legacy session.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop_get_stream();
        if let Some(sid) = self.session.take_id() {
            self.end_session(sid, timeout).await;
        }
    }

    /// [`Self::end_session`] on a task of its own, within [`SESSION_END_LIMIT`]: what
    /// began the session may be going away (a deadline, a dropped future). Never the
    /// session held (a server may hand out the same id again).
    fn end_session_later(&self, sid: String) {
        if self.session.id().as_deref() == Some(sid.as_str()) {
            return;
        }
        let (Some(this), Ok(runtime)) =
            (self.this.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move { this.end_session(sid, SESSION_END_LIMIT).await });
    }

    /// DELETEs a legacy session (405 is allowed: the server does not let clients end
    /// sessions), within `timeout`.
    async fn end_session(&self, sid: String, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.delete_session(sid).send()).await;
    }

    /// The DELETE of session `sid`, with the token as it is, not renewed: a refresh
    /// begun here (often at shutdown) could be cut off after its server rotated the
    /// refresh token.
    fn delete_session(&self, sid: String) -> reqwest::RequestBuilder {
        let mut headers = self.fixed.clone();
        self.authorize(&mut headers, None);
        let req = self
            .client
            .delete(self.url.clone())
            .headers(headers)
            .header(SESSION_HEADER, sid);
        // Every request after `initialize` carries it (2025-06-18 on): a strict server
        // refuses a DELETE without it, and the session is left to expire.
        match self.session.version() {
            Some(v) => req.header(VERSION_HEADER, v),
            None => req,
        }
    }
}

/// A session id as the spec has them, visible ASCII (0x21 to 0x7E), and at most
/// [`SESSION_ID_BYTES`]: it goes back on every request. One that is not (empty, spaces,
/// megabytes) is taken for none.
fn usable_session_id(id: &[u8]) -> Option<&str> {
    let usable = !id.is_empty()
        && id.len() <= SESSION_ID_BYTES
        && id.iter().all(|b| (0x21..=0x7e).contains(b));
    usable.then(|| std::str::from_utf8(id).ok()).flatten()
}

/// The longest session id taken.
const SESSION_ID_BYTES: usize = 1024;

impl Drop for HttpTransport {
    fn drop(&mut self) {
        self.stop_get_stream();
        // Dropped with a session held, never shut down (a connect given up between
        // `initialize` and `initialized`): the session is ended on a task of its own,
        // not left to the server's expiry (a server that stalls `initialized` would
        // hold one per restart).
        // (Closed: a shutdown or a detach ended it already.)
        if self.is_closed() {
            return;
        }
        self.end_held_session_later();
    }
}

/// A session an `initialize` began (the first, or a renewal's) and not yet handed on
/// or ended: ended on a task of its own if what holds it is dropped first.
struct Begun {
    transport: Weak<HttpTransport>,
    sid: Option<String>,
    /// Held by the transport already (the first `initialize`'s): let go of before it
    /// is ended, so that the transport does not end it again, nor keep using it.
    adopted: bool,
}

impl Begun {
    /// The session id, which the renewal now puts in use or ends itself.
    fn take(&mut self) -> String {
        self.sid.take().unwrap_or_default()
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        if let (Some(sid), Some(transport)) = (self.sid.take(), self.transport.upgrade()) {
            if self.adopted {
                transport.session.take_id_if(&sid);
            }
            transport.end_session_later(sid);
        }
    }
}

/// How long ending a session a renewal began after shutdown may take.
const SESSION_END_LIMIT: Duration = Duration::from_secs(2);

/// The longest a legacy request's `notifications/cancelled` is tried for.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// A request sent in a legacy session and not answered yet (`id`), whose caller may stop
/// waiting (a deadline, a cancellation): dropped then, it POSTs `notifications/cancelled`
/// for it. The released revisions ask for one: a closed stream is no cancellation there
/// (a resumable server goes on with the call). 2026-07-28 cancels by the closed stream
/// alone, and is sent none.
struct CancelUnanswered<'a> {
    transport: &'a HttpTransport,
    id: Option<RequestId>,
    identity: Option<&'a str>,
}

impl Drop for CancelUnanswered<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let t = self.transport;
        if t.session.version().is_some() && !t.is_closed() {
            t.cancel_later(id, self.identity);
        }
    }
}

/// Renewals of a legacy session that may fail in a row before the connection is given
/// up ([`TransportError::SessionRefused`]).
const RENEWALS_FAILED_MAX: u64 = 3;

/// A renewal of an expired session that failed: the request reached the server (it
/// answered 404), so never "not sent".
fn renewal_failed(why: String) -> TransportError {
    TransportError::HttpStatus {
        status: 404,
        body: format!("session expired and re-initializing failed: {why}"),
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

fn redirect(response: &reqwest::Response) -> TransportError {
    let location = response
        .headers()
        .get(LOCATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    TransportError::Redirect {
        status: response.status().as_u16(),
        // Server-controlled: kept short (it is printed escaped).
        location: location.chars().take(300).collect(),
    }
}

/// A request's failure to be sent and answered. Only a failure to connect proves it
/// never reached the server (a TLS failure then, its handshake's); one on a connection
/// already open (a TLS alert while the answer was read, say) may come after the server
/// took it.
fn send_error(e: reqwest::Error) -> TransportError {
    if e.is_connect() {
        if let Some(tls) = super::error::tls_failure(&e) {
            return tls;
        }
        TransportError::NotSent(format!(
            "connection failed: {}",
            crate::util::text::http_failure(e)
        ))
    } else {
        TransportError::Network(crate::util::text::http_failure(e))
    }
}

async fn read_body(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, TransportError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| TransportError::Network(crate::util::text::http_failure(e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(TransportError::ResponseTooLarge { limit: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A 401 or 403, with the server's Bearer challenge.
fn unauthorized(response: &reqwest::Response) -> TransportError {
    let challenge = Challenge::bearer(
        response
            .headers()
            .get_all(reqwest::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    TransportError::Unauthorized {
        status: response.status().as_u16(),
        challenge,
    }
}

/// `work`'s output, or `None` once `deadline` passes first (no deadline: waits).
async fn waited<T>(
    work: impl std::future::Future<Output = T>,
    deadline: Option<Instant>,
) -> Option<T> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, work).await.ok(),
        None => Some(work.await),
    }
}

/// What is left of a request's time once a sign-in was waited for: what the deadline
/// leaves (the wait counts), or all of it for a handshake, which waits sign-ins out.
fn left_after_sign_in(left: Duration, deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(at) => left.min(at.saturating_duration_since(Instant::now())),
        None => left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_taken_only_as_the_spec_has_them() {
        assert_eq!(usable_session_id(b"a1-B2_c3"), Some("a1-B2_c3"));
        let longest = vec![b'x'; SESSION_ID_BYTES];
        assert!(usable_session_id(&longest).is_some());
        for bad in [
            &b""[..],
            b"a b",
            b"a\tb",
            "é".as_bytes(),
            &[b'x'; SESSION_ID_BYTES + 1],
        ] {
            assert_eq!(usable_session_id(bad), None, "{bad:?}");
        }
    }

    // Sent again twice (a sign-in, then a renewed session): the server's requests on the
    // last stream are still the request's as it was made.
    #[tokio::test]
    async fn a_request_sent_again_twice_is_still_the_one_it_was_made_as() {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let spec = HttpSpec {
            url: "http://127.0.0.1:1/mcp".into(),
            ..HttpSpec::default()
        };
        let sign_in = crate::transport::auth::SignInContext::default();
        let inbound = InboundSink::new(tx, None);
        let limit = Duration::from_secs(1);
        let t = HttpTransport::new("s", &spec, 1 << 20, Ids::new(), inbound, &sign_in, limit)
            .await
            .expect("a transport");
        let made = RequestId::Number(100);
        let (first, noted_first) = t.resend(&made);
        let (second, noted_second) = t.resend(&first);
        assert_eq!(t.made_as(&second), made);
        assert_eq!(t.made_as(&first), made);
        assert_eq!(t.made_as(&made), made);
        drop((noted_first, noted_second));
        assert!(t.resent.lock().is_empty(), "forgotten once answered");
    }
}
