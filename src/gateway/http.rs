//! The gateway over Streamable HTTP at `/mcp` (hyper, HTTP/1.1).
//!
//! Before anything is parsed: `Host` must be a loopback name, the listen address or an
//! allowed host, and an `Origin`, when present, one of the allowed origins or the host's
//! own (DNS rebinding, 403), and then a browser's CORS preflight is answered; the
//! principal comes from the bearer token (401 with a
//! `WWW-Authenticate` challenge without one); the body is read up to
//! `max_body_bytes` (413). 2026-07-28 requests have their headers checked against the
//! body (-32020, 400). A POST with `Mcp-Session-Id`, or an `initialize`, is legacy: the
//! session is made at `initialize`, forgotten after `session_idle` (404), has a GET
//! stream for `notifications/tools/list_changed`, and is ended by DELETE. A legacy call
//! whose tool asks for input answers with an event stream carrying the gateway's
//! requests; the client POSTs its answers back on the session.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::{
    Admitted, Client, ClientPeer, Gateway, InFlight, LegacyClient, PeerFuture, Principal,
    Questions, id_key,
};
use crate::call::CancelToken;
use crate::protocol::error::{HEADER_MISMATCH, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::protocol::meta::KEY_PROTOCOL_VERSION;
use crate::protocol::{Message, Notification, Request, RequestId, Response, RpcError};
use crate::server::ListsChanged;
use crate::transport::http::headers::mcp_name;

type HttpBody = BoxBody<Bytes, Infallible>;
type HttpResponse = hyper::Response<HttpBody>;

/// Legacy sessions held at once; past it `initialize` gets 503.
const MAX_SESSIONS: usize = 10_000;
/// Legacy sessions of one principal; past it its `initialize` gets 503.
const MAX_SESSIONS_PER_PRINCIPAL: usize = 64;
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 1024;
/// A body past this is large: parsed, JSON takes many times its size in memory (a 4 MiB
/// array of small numbers, some 64 MiB), so a principal's large bodies in flight come to
/// at most `LARGE_BODY_BUDGET` × `max_body_bytes` bytes; past it, 503.
pub(crate) const LARGE_BODY: usize = 64 * 1024;
pub(crate) const LARGE_BODY_BUDGET: usize = 4;
/// Every principal's large bodies together: at most this many × `max_body_bytes` of
/// calls, and as many of answers (apart, as each principal's are: large calls waiting
/// for large answers must not keep those out); past it, 503. Each principal's budget
/// alone would let many principals (a JWT issuer's every subject is one) hold without
/// bound.
pub(crate) const LARGE_BODY_ALL: usize = 16;

/// Every principal's count of one kind of large bodies.
type AllOf = fn(&State) -> &AtomicUsize;
/// A bound on every principal's count, and which count it is.
type AllBound = Option<(usize, AllOf)>;
/// A principal's large-body budget, and every principal's together.
type Budget = (fn(&State) -> &Mutex<HashMap<Principal, usize>>, AllOf);
/// The calls' budgets ([`Budget`]).
const CALLS: Budget = (|s| &s.large_bodies, |s| &s.large_bodies_all);
/// The answers' budgets ([`Budget`]).
const ANSWERS: Budget = (|s| &s.large_answers, |s| &s.large_answers_all);
/// The budgets of large results not yet written ([`Budget`], [`HeldBody`]).
const RESULTS: Budget = (|s| &s.large_results, |s| &s.large_results_all);
/// A request's headers must arrive within this, and its body within `BODY_TIMEOUT`
/// (a client that trickles bytes holds nothing for long).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Notifications queued per GET stream; a stream that does not read loses the extra
/// ones (list_changed says the same thing twice).
const STREAM_QUEUE: usize = 8;
/// How long a shut-down listener waits for responses to be written.
const DRAIN: Duration = Duration::from_secs(5);

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = hyper::Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    if !content_type.is_empty()
        && let Ok(v) = content_type.parse()
    {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn json_message(status: StatusCode, message: &Message) -> HttpResponse {
    let mut body = Vec::new();
    message.write_json(&mut body);
    full(status, "application/json", body)
}

fn error_reply(status: StatusCode, id: Option<RequestId>, error: RpcError) -> HttpResponse {
    json_message(
        status,
        &Message::Response(Response {
            id,
            outcome: Err(error),
        }),
    )
}

fn sse_frame(message: &Message) -> Bytes {
    Bytes::from(sse_event(message))
}

fn sse_event(message: &Message) -> Vec<u8> {
    let mut frame = b"data: ".to_vec();
    message.write_json(&mut frame);
    frame.extend_from_slice(b"\n\n");
    frame
}

/// Sends a call's answer last on its event stream ([`call_stream`]): a large one goes
/// by `last`, held to `principal`'s results' budget until its client has taken it.
async fn send_answer(
    state: &Arc<State>,
    principal: &Principal,
    (tx, last): (mpsc::Sender<Bytes>, oneshot::Sender<HeldBody>),
    answer: &Message,
) {
    match HeldBody::of(state, principal, sse_event(answer)) {
        Ok(held) => {
            // The channel's frames are written first: its sender goes before the answer is taken.
            drop(tx);
            let _ = last.send(held);
        }
        Err(small) => {
            let _ = tx.send(Bytes::from(small)).await;
        }
    }
}

/// A response body fed by a channel: one SSE frame per message; a long-lived stream
/// holds a place among [`State::streams`] until its body is dropped.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    _place: Option<StreamPlace>,
    /// Ends the body when its place is taken for another principal's stream (a
    /// stream whose task ends it with a last message itself has none).
    ended: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    /// A legacy GET stream's place among its principal's.
    _slot: Option<PrincipalSlot>,
    /// When its credentials expire: the stream ends then.
    until: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A call's large result, written after the channel's frames (its sender goes
    /// first), charged to its principal until taken ([`HeldBody`]).
    last: Option<oneshot::Receiver<HeldBody>>,
    held: Option<HeldBody>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(until) = self.until.as_mut()
            && until.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        if let Some(ended) = self.ended.as_mut()
            && ended.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        if let Some(held) = self.held.as_mut() {
            return Poll::Ready(held.next_piece().map(|p| Ok(Frame::data(p))));
        }
        match ready!(self.rx.poll_recv(cx)) {
            Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
            None => {
                let Some(last) = self.last.as_mut() else {
                    return Poll::Ready(None);
                };
                let held = ready!(Pin::new(last).poll(cx)).ok();
                self.last = None;
                self.held = held;
                Poll::Ready(
                    self.held
                        .as_mut()
                        .and_then(HeldBody::next_piece)
                        .map(|p| Ok(Frame::data(p))),
                )
            }
        }
    }
}

/// A large result's body, charged to its principal's results until its client has
/// taken it: handed to hyper a piece at a time, as its connection has room (hyper asks
/// for the next piece once its own buffer, at most `MAX_HEADER_BUFFER`, has room). A
/// client that reads slowly, a few bytes at a time (which the write timeout never
/// ends), holds the result here, counted, and its principal's new requests are
/// refused past the budget ([`results_refusal`]); before, every connection could hold one.
struct HeldBody {
    /// The result, and how much of it hyper has taken: pieces are copies, so that
    /// the whole result goes when this does (a piece of a shared `Bytes` would keep
    /// all of it alive, uncharged, in hyper's queue).
    result: Vec<u8>,
    taken: usize,
    _slot: PrincipalSlot,
}

/// The most of a held result handed to hyper at once.
const HELD_PIECE: usize = 64 << 10;

impl HeldBody {
    /// `body` charged to `principal`'s results when it is large; back as it is if not.
    fn of(state: &Arc<State>, principal: &Principal, body: Vec<u8>) -> Result<Self, Vec<u8>> {
        if body.len() <= LARGE_BODY {
            return Err(body);
        }
        let mut body = body;
        // Charged what it takes: the buffer as allocated.
        body.shrink_to_fit();
        let slot = PrincipalSlot::charged(state, principal, RESULTS, body.capacity());
        Ok(HeldBody {
            result: body,
            taken: 0,
            _slot: slot,
        })
    }

    fn next_piece(&mut self) -> Option<Bytes> {
        let rest = self.result.get(self.taken..).filter(|r| !r.is_empty())?;
        let piece = Bytes::copy_from_slice(&rest[..rest.len().min(HELD_PIECE)]);
        self.taken += piece.len();
        Some(piece)
    }
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.next_piece().map(|p| Ok(Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.taken >= self.result.len()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.result.len().saturating_sub(self.taken) as u64)
    }
}

/// `message` as a JSON answer to `principal`, held to its results' budget while its
/// client has not taken it, when large.
fn held_json(
    state: &Arc<State>,
    principal: &Principal,
    status: StatusCode,
    message: &Message,
) -> HttpResponse {
    let mut body = Vec::new();
    message.write_json(&mut body);
    let held = match HeldBody::of(state, principal, body) {
        Ok(held) => held,
        Err(small) => return full(status, "application/json", small),
    };
    let mut r = hyper::Response::new(held.boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The refusal of `principal`'s next request, if it may make none: not while its large results not
/// yet taken come to `LARGE_BODY_BUDGET` × `max_body_bytes`, nor while it holds any
/// and every principal's come to `LARGE_BODY_ALL` × that (the 503 that says so
/// otherwise). A principal that holds none is never held back by the others'.
fn results_refusal(
    state: &State,
    principal: &Principal,
    id: Option<RequestId>,
) -> Option<HttpResponse> {
    let limit = state.gateway.config().max_body_bytes;
    let (budget, all) = (
        limit.saturating_mul(LARGE_BODY_BUDGET),
        limit.saturating_mul(LARGE_BODY_ALL),
    );
    let held = (RESULTS.0)(state)
        .lock()
        .get(principal)
        .copied()
        .unwrap_or(0);
    // Up to the budget itself: one result of the largest a server may send (as large
    // as the default budget) does not hold back its principal's other requests while
    // its client reads it.
    if held <= budget && (held == 0 || (RESULTS.1)(state).load(Ordering::Acquire) <= all) {
        return None;
    }
    let mut r = error_reply(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        RpcError::new(
            -32000,
            format!(
                "too many large results not yet read (agent {}'s at most {budget} bytes together, and every agent's {all}): read them first",
                principal.agent
            ),
        ),
    );
    r.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    Some(r)
}

fn sse_response(rx: mpsc::Receiver<Bytes>) -> HttpResponse {
    sse_stream(rx, None, false, None, None)
}

/// A call's event stream: its frames from `rx`, then its result from `last` when
/// that is large (see [`send_answer`]).
fn call_stream(rx: mpsc::Receiver<Bytes>, last: oneshot::Receiver<HeldBody>) -> HttpResponse {
    event_stream(ChannelBody {
        rx,
        _place: None,
        ended: None,
        _slot: None,
        until: None,
        last: Some(last),
        held: None,
    })
}

/// [`sse_response`] for a stream that may stay open for as long as its client likes,
/// in `place`; with `ends_when_taken`, the body ends when its place is taken.
fn sse_stream(
    rx: mpsc::Receiver<Bytes>,
    place: Option<StreamPlace>,
    ends_when_taken: bool,
    slot: Option<PrincipalSlot>,
    until: Option<Instant>,
) -> HttpResponse {
    let ended = place
        .as_ref()
        .filter(|_| ends_when_taken)
        .map(|p| Box::pin(p.taken.clone().cancelled_owned()));
    event_stream(ChannelBody {
        rx,
        _place: place,
        ended,
        _slot: slot,
        until: until.map(|t| Box::pin(tokio::time::sleep_until(t.into()))),
        last: None,
        held: None,
    })
}

fn event_stream(body: ChannelBody) -> HttpResponse {
    let mut r = hyper::Response::new(body.boxed());
    let headers = r.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    // Each event as it comes: no cache, and no buffering in a proxy (nginx's header).
    headers.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    headers.insert(
        "x-accel-buffering",
        hyper::header::HeaderValue::from_static("no"),
    );
    r
}

/// The gateway's questions to one legacy client.
type Pending = Arc<Questions>;

struct Session {
    principal: Principal,
    /// The bearer token of its last request that opened a stream or made a call, if it
    /// was admitted with one: a reload checks it again (the sweep).
    credential: Option<super::Credential>,
    client: LegacyClient,
    last_seen: Instant,
    pending: Pending,
    /// The GET streams, for notifications, with their places among [`State::streams`]
    /// and the list changes each owes (its queue was full: see [`Session::tell`]).
    streams: Vec<(mpsc::Sender<Bytes>, u64, ListsChanged)>,
    /// What streams gone (closed, replaced) still owed: the session's next stream is
    /// told (a client that stopped reading reconnects).
    orphaned: ListsChanged,
    /// Requests in flight, for `notifications/cancelled`.
    calls: InFlight<RequestId>,
}

impl Session {
    /// Sends each of `changed` to its GET streams, and to each stream the changes it
    /// owes; true when one still owes some. A change that finds a stream's queue full
    /// (of other lists' changes, perhaps) is owed by that stream, not dropped: sent to
    /// it again later, and to it alone (one missing leaves a list stale).
    fn tell(&mut self, changed: ListsChanged, frames: &[(&str, Bytes)]) -> bool {
        let mut owes = false;
        let mut lost = ListsChanged::default();
        self.streams.retain_mut(|(tx, _, owed)| {
            let lists = std::mem::take(owed).union(changed);
            for method in lists.methods() {
                let Some((_, frame)) = frames.iter().find(|(m, _)| *m == method) else {
                    continue;
                };
                match tx.try_send(frame.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        owed.mark(method);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        lost = lost.union(lists);
                        return false;
                    }
                }
            }
            owes |= owed.any();
            true
        });
        self.orphaned = self.orphaned.union(lost);
        owes
    }

    /// Drops the streams that are closed, keeping what they owed for the next one.
    fn drop_closed_streams(&mut self) {
        let mut lost = ListsChanged::default();
        self.streams.retain(|(tx, _, owed)| {
            let open = !tx.is_closed();
            if !open {
                lost = lost.union(*owed);
            }
            open
        });
        self.orphaned = self.orphaned.union(lost);
    }

    /// Whether it has been idle past `idle`: no request started or ended for that long,
    /// none in flight, and no GET stream open (a client listening for notifications is
    /// still there; one that vanished is noticed by the stream's keep-alive).
    fn idle(&mut self, idle: Duration) -> bool {
        if self.last_seen.elapsed() <= idle {
            return false;
        }
        self.drop_closed_streams();
        self.calls.is_empty() && self.streams.is_empty()
    }

    /// The gateway shuts down: the questions it was asked fail and its streams end;
    /// its calls in flight are left the harness's grace.
    fn close_for_shutdown(&mut self) {
        self.pending.clear();
        self.streams.clear();
    }

    /// The session is over (DELETE, expiry, shutdown): its calls are cancelled, the
    /// questions it was asked fail, its streams end.
    fn end(&mut self) {
        // The questions first: a call that sees its cancel and drops its question then
        // finds it over, and withdraws nothing from a client that is gone.
        self.pending.clear();
        self.calls.cancel_all();
        self.streams.clear();
    }
}

/// A `notifications/progress` frame.
fn progress_frame(params: Value) -> Bytes {
    sse_frame(&Message::Notification(Notification {
        method: "notifications/progress".into(),
        params: Some(params),
    }))
}

struct State {
    gateway: Gateway,
    /// `host:port` the listener is bound to.
    local: String,
    sessions: Mutex<HashMap<String, Session>>,
    next_request: AtomicU64,
    /// `subscriptions/listen` streams open, per principal.
    listens: Mutex<HashMap<Principal, usize>>,
    /// Legacy GET streams open, per principal.
    gets: Mutex<HashMap<Principal, usize>>,
    /// Bytes of large bodies in flight, per principal.
    large_bodies: Mutex<HashMap<Principal, usize>>,
    /// The same, for bodies that come while the gateway waits for the principal's
    /// answers: a budget of their own, so that large calls waiting for large answers
    /// do not keep those answers out.
    large_answers: Mutex<HashMap<Principal, usize>>,
    /// Bytes of large bodies in flight, every principal's together: calls', answers'.
    large_bodies_all: AtomicUsize,
    large_answers_all: AtomicUsize,
    /// Bytes of large results not yet taken by their clients, per principal and in
    /// all ([`HeldBody`]).
    large_results: Mutex<HashMap<Principal, usize>>,
    large_results_all: AtomicUsize,
    /// Cancelled at shutdown: subscriptions end with their final result.
    closing: CancelToken,
    /// Long-lived streams (legacy GET streams, `subscriptions/listen`): at most
    /// `max_streams` (default half of [`MAX_CONNECTIONS`]), so that clients that open
    /// them and never read cannot take every connection from those that make requests.
    streams: Arc<Streams>,
}

/// The long-lived streams open, every principal's: at most `max` of them, shared
/// between principals as [`super::fair`] has it.
struct Streams {
    max: usize,
    open: Mutex<HashMap<u64, OpenStream>>,
    next: AtomicU64,
}

struct OpenStream {
    principal: Principal,
    /// Cancelled when its place is taken for another principal's stream.
    taken: CancelToken,
}

/// A long-lived stream's place among [`Streams`], given back when it drops.
struct StreamPlace {
    streams: Arc<Streams>,
    id: u64,
    /// Cancelled when the place is taken for another principal's stream: the stream
    /// ends then.
    taken: CancelToken,
}

impl Streams {
    fn new(max: usize) -> Streams {
        Streams {
            max,
            open: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// A place for one more stream of `principal`, if there is one; `replacing`, the
    /// place of one of its streams that this one replaces (that stream ends). When all
    /// are taken, the principal holding the most gives up its oldest stream, if it
    /// holds at least two more than this one: a few principals each within their own
    /// caps cannot keep the others from every stream.
    fn take(
        self: &Arc<Self>,
        principal: &Principal,
        replacing: Option<u64>,
    ) -> Option<StreamPlace> {
        let mut open = self.open.lock();
        if let Some(old) = replacing.and_then(|id| open.remove(&id)) {
            old.taken.cancel();
        }
        if open.len() >= self.max {
            // Ids grow: the smallest is the oldest.
            let held = open.iter().map(|(id, s)| (*id, &s.principal, *id));
            let id = super::fair::place_to_free(held, principal)?;
            if let Some(gone) = open.remove(&id) {
                // Clients make these as fast as they open sessions or streams: budgeted.
                static BUDGET: crate::util::log_budget::LogBudget =
                    crate::util::log_budget::LogBudget::new();
                if let Some(count) = BUDGET.log() {
                    tracing::info!(agent = %gone.principal.agent, count, "a stream was ended to make room for another agent's");
                }
                gone.taken.cancel();
            }
        }
        if open.len() >= self.max {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let taken = CancelToken::new();
        open.insert(
            id,
            OpenStream {
                principal: principal.clone(),
                taken: taken.clone(),
            },
        );
        Some(StreamPlace {
            streams: self.clone(),
            id,
            taken,
        })
    }
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.streams.open.lock().remove(&self.id);
    }
}

/// Subscriptions one principal may hold open at once.
pub(crate) const MAX_LISTENS_PER_PRINCIPAL: usize = 16;
/// Legacy GET streams one principal may hold open at once (one per session it may
/// have): with its subscriptions, a principal holds at most 80 of the gateway's
/// `max_streams`, not all of them.
const MAX_GETS_PER_PRINCIPAL: usize = MAX_SESSIONS_PER_PRINCIPAL;
/// The longest the `Mcp-Param-*` check may take; past it a call that carries such
/// headers is refused (504), one that carries none goes on.
const PARAM_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a request is read and checked before its call is in flight: its body,
/// then its `Mcp-Param` headers (a cancellation that overtook it is kept this long).
pub(super) const REQUEST_LAG_MAX: Duration = BODY_TIMEOUT.saturating_add(PARAM_CHECK_TIMEOUT);
/// How often an idle subscription stream is written to.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Serves the gateway on `listener` until `shutdown` resolves; then stops accepting and
/// shuts the harness down (calls in flight finish within its grace, their records
/// written), and returns.
pub async fn serve(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), super::GatewayError> {
    let local = listener.local_addr()?.to_string();
    let max_streams = gateway.config().max_streams;
    // A config built in code is not checked as a file's is: zero would close every
    // connection that waits at all, and past ten years the timer's deadline overflows.
    let write_timeout = gateway
        .config()
        .write_timeout
        .clamp(Duration::from_millis(1), crate::util::duration::LONGEST);
    let state = Arc::new(State {
        gateway,
        local,
        sessions: Mutex::default(),
        next_request: AtomicU64::new(1),
        listens: Mutex::default(),
        gets: Mutex::default(),
        large_bodies: Mutex::default(),
        large_answers: Mutex::default(),
        large_bodies_all: AtomicUsize::new(0),
        large_answers_all: AtomicUsize::new(0),
        large_results: Mutex::default(),
        large_results_all: AtomicUsize::new(0),
        closing: CancelToken::new(),
        streams: Arc::new(Streams::new(max_streams)),
    });
    let notifier = tokio::spawn(notify_changes(Arc::downgrade(&state)));
    let sweeper = tokio::spawn(sweep(Arc::downgrade(&state), state.gateway.reloads()));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let peers = super::side::Peers::new(state.gateway.config().max_connections_per_peer);
    let mut shutdown = std::pin::pin!(shutdown);
    let failures = crate::util::log_budget::LogBudget::default();
    while let Some((stream, permit)) =
        super::side::accept("mcp", &listener, &connections, &mut shutdown, &failures).await
    {
        let Ok(peer) = stream.peer_addr() else {
            continue; // gone already
        };
        // A peer that opens connections and sends nothing holds at most its share,
        // each for the header timeout: the other peers keep the rest.
        let Some(slot) = peers.take(peer.ip()) else {
            tracing::debug!(peer = %peer.ip(), "connection closed: its peer has max_connections_per_peer open");
            continue;
        };
        let _ = stream.set_nodelay(true);
        // A client that stops reading would hold the connection (and the calls on it)
        // for as long as its TCP stack keeps acknowledging, which can be forever; a
        // write that makes no progress for `write_timeout` fails instead, and hyper
        // closes the connection. The timer runs only while a write waits: an idle
        // stream is never cut off.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(write_timeout));
        let service_state = state.clone();
        let service = hyper::service::service_fn(move |req| {
            let state = service_state.clone();
            async move { Ok::<_, Infallible>(handle(state, req).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(super::side::MAX_HEADER_BUFFER)
            .serve_connection(hyper_util::rt::TokioIo::new(Box::pin(stream)), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop((permit, slot));
        });
    }
    drop(listener);
    notifier.abort();
    sweeper.abort();
    state.closing.cancel();
    // Sessions' questions fail and their streams close; their calls in flight, as
    // every other, finish within the harness's grace or are cancelled, and their
    // answers are written before the connections close.
    for session in state.sessions.lock().values_mut() {
        session.close_for_shutdown();
    }
    state.gateway.drop_parked();
    let harness = state.gateway.harness().clone();
    harness.shutdown().await;
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
    for (_, mut session) in state.sessions.lock().drain() {
        session.end();
    }
    Ok(())
}

/// How often [`sweep`] runs: twice per `session_idle`, within a quarter second and half
/// a minute.
fn sweep_every(state: &State) -> Duration {
    (state.gateway.config().session_idle / 2)
        .clamp(Duration::from_millis(250), Duration::from_secs(30))
}

/// Ends, without waiting for them to be touched again, legacy sessions idle past
/// `session_idle` ([`Session::idle`]), and those of principals no token or issuer in
/// force admits any more (a reload revoked them), their calls and streams with them.
/// Subscriptions check their own principal; parked rounds are the gateway's to sweep.
async fn sweep(state: std::sync::Weak<State>, mut reloads: tokio::sync::watch::Receiver<u64>) {
    // The sweep after a reload checks JWTs again too: a request let in under the keys
    // of before may have stored its JWT on its session after the reload's check.
    let mut recheck_next = false;
    // And after the issuer's keys changed between reloads (read again from its URL):
    // from the start, not from the first sweep (a key dropped before it went unseen).
    let mut keys_seen = state.upgrade().map(|s| s.gateway.identity().keys_changed());
    loop {
        let Some(every) = state.upgrade().map(|s| sweep_every(&s)) else {
            return;
        };
        let reloaded = tokio::select! {
            () = tokio::time::sleep(every) => false,
            Ok(()) = reloads.changed() => true,
        };
        let Some(state) = state.upgrade() else { return };
        let identity = state.gateway.identity();
        let keys = identity.keys_changed();
        let rekeyed = keys_seen.is_some_and(|seen| seen != keys);
        keys_seen = Some(keys);
        let recheck = reloaded || rekeyed || std::mem::take(&mut recheck_next);
        recheck_next = reloaded || rekeyed;
        let idle = state.gateway.config().session_idle;
        // Sessions whose token no longer admits them (a configured token replaced, a
        // JWT's key removed or the issuer's settings changed): copied, then checked
        // outside the lock (a signature each, for JWTs).
        let unverified: HashMap<String, super::Credential> = if recheck {
            let opened: Vec<(String, Principal, super::Credential)> = (state.sessions.lock())
                .iter()
                .filter_map(|(id, s)| {
                    Some((id.clone(), s.principal.clone(), s.credential.clone()?))
                })
                .collect();
            opened
                .into_iter()
                .filter(|(_, p, credential)| !identity.admits_with(p, Some(credential)))
                .map(|(id, _, credential)| (id, credential))
                .collect()
        } else {
            HashMap::new()
        };
        // Only if its JWT is still the one checked (a call may have brought a new one).
        let stale = |id: &String, s: &Session| {
            unverified
                .get(id)
                .is_some_and(|j| s.credential.as_ref() == Some(j))
        };
        let mut unverified_ended = 0;
        let ended: Vec<(String, Session)> = state
            .sessions
            .lock()
            .extract_if(|id, s| {
                let stale = stale(id, s);
                unverified_ended += usize::from(stale);
                s.idle(idle) || !identity.admits(&s.principal) || stale
            })
            .collect();
        if unverified_ended > 0 {
            tracing::info!(
                ended = unverified_ended,
                "legacy sessions whose bearer token no longer admits them were ended"
            );
        }
        for (_, mut session) in ended {
            session.end();
        }
    }
}

/// Queues a keep-alive comment on a stream, only when nothing else waits on it: a
/// client that does not read keeps its queue's room for a list change, which comments
/// would otherwise fill. False when the stream is gone.
fn keep_alive_sent(tx: &mpsc::Sender<Bytes>) -> bool {
    if tx.capacity() == tx.max_capacity() {
        let _ = tx.try_send(Bytes::from_static(b": keep-alive\n\n"));
    }
    !tx.is_closed()
}

/// Sends `notifications/*/list_changed` to every legacy session's GET stream when the
/// harness reports a change of its lists.
async fn notify_changes(state: std::sync::Weak<State>) {
    let Some((mut events, mut views)) = state
        .upgrade()
        .map(|s| (s.gateway.harness().subscribe(), s.gateway.views()))
    else {
        return;
    };
    let frame = |method: &str| {
        sse_frame(&Message::Notification(Notification {
            method: method.into(),
            params: None,
        }))
    };
    let frames: Vec<(&str, Bytes)> = ListsChanged::ALL.methods().map(|m| (m, frame(m))).collect();
    // When a session's changes owed (a stream's queue was full) are tried again.
    let mut retry: Option<tokio::time::Instant> = None;
    loop {
        let owed_due = async {
            match retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // `None`: the retry of what is owed. `Err`: a change for every session (a
        // lagged receiver lost events: everyone is told every list, to be safe; how
        // tools are served changed: every tool list).
        let event: Option<Result<_, ListsChanged>> = tokio::select! {
            event = events.recv() => match event {
                Ok(e) => Some(Ok(e)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some(Err(ListsChanged::ALL)),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            Ok(()) = views.changed() => Some(Err(Gateway::VIEW_CHANGED)),
            () = owed_due => None,
        };
        let Some(state) = state.upgrade() else { return };
        let mut owes = false;
        // Once per principal, not per session (each looks up grants), under the lock
        // every legacy request takes.
        let mut of_principal: HashMap<Principal, ListsChanged> = HashMap::new();
        for session in state.sessions.lock().values_mut() {
            let changed = match &event {
                Some(Ok(e)) => *of_principal
                    .entry(session.principal.clone())
                    .or_insert_with(|| state.gateway.changes(&session.principal, e)),
                Some(Err(all)) => *all,
                None => ListsChanged::default(),
            };
            owes |= session.tell(changed, &frames);
        }
        retry = match (owes, retry, &event) {
            (false, ..) => None,
            // Fixed when the first was owed: other events do not put it off.
            (true, Some(at), Some(_)) => Some(at),
            (true, ..) => Some(tokio::time::Instant::now() + super::OWED_RETRY),
        };
    }
}

fn header<'a>(req: &'a hyper::Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Whether `Host` and `Origin` name this gateway (see the module docs).
fn origin_allowed(state: &State, req: &hyper::Request<Incoming>) -> Result<(), &'static str> {
    let config = state.gateway.config();
    let host = header(req, "host").unwrap_or("");
    let host_name = host
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(h, _)| h);
    // Host names are compared as DNS does, without case.
    let loopback =
        host_name.eq_ignore_ascii_case("localhost") || matches!(host_name, "127.0.0.1" | "[::1]");
    let allowed = config
        .allowed_hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(host_name));
    if !(loopback || host == state.local || allowed) {
        return Err("Host is not this gateway");
    }
    // An Origin that is not text, or several, is refused, not skipped.
    let mut origins = req.headers().get_all("origin").iter();
    if let (Some(_), Some(_)) = (origins.next(), origins.next()) {
        return Err("Origin is sent more than once");
    }
    if let Some(origin) = req.headers().get("origin") {
        let origin = origin.to_str().map_err(|_| "Origin is not text")?;
        let own = [format!("http://{host}"), format!("https://{host}")];
        if !(own.iter().any(|o| o == origin) || config.allowed_origins.iter().any(|o| o == origin))
        {
            return Err("Origin is not allowed");
        }
    }
    Ok(())
}

/// Where the protected resource metadata of `resource` is (RFC 9728: the well-known
/// path between the origin and the resource's path).
fn metadata_path(resource: &str) -> String {
    let path = url::Url::parse(resource)
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    format!("/.well-known/oauth-protected-resource{path}")
}

/// An answer before anyone was identified (a refusal, a preflight, public metadata),
/// with the connection closed after it: an unidentified client must not keep a
/// connection slot with cheap requests.
fn refused_before_identity(mut r: HttpResponse) -> HttpResponse {
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// Headers a browser may send cross-origin (besides those it always may), and
/// `Mcp-Param-*`, whose names the tools' schemas choose.
const CORS_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "mcp-method",
    "mcp-name",
];
/// Headers a browser script may read from an answer.
const CORS_EXPOSED: &str = "mcp-session-id, mcp-protocol-version, www-authenticate";

async fn handle(state: Arc<State>, req: hyper::Request<Incoming>) -> HttpResponse {
    // Shutting down: what is in flight finishes, nothing new starts (a session or a
    // stream opened now would hold the connections' drain).
    if state.closing.is_cancelled() {
        return refused_before_identity(full(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the gateway is shutting down",
        ));
    }
    if let Err(why) = origin_allowed(&state, &req) {
        return refused_before_identity(full(StatusCode::FORBIDDEN, "text/plain", why));
    }
    // An Origin that passed is the host's own or an allowed one: a browser page there
    // may call the gateway (CORS), its preflight answered without credentials.
    let Some(origin) = header(&req, "origin").and_then(|o| HeaderValue::from_str(o).ok()) else {
        // Varies by Origin all the same: a cache must not give this answer to a page.
        let mut r = handle_allowed(state, req).await;
        r.headers_mut()
            .append(hyper::header::VARY, HeaderValue::from_static("origin"));
        return r;
    };
    if req.method() == Method::OPTIONS {
        // Closed after it, as every answer to a client not identified yet: a preflight
        // every few seconds would otherwise hold a connection slot without credentials.
        return refused_before_identity(preflight(&req, origin));
    }
    let mut r = handle_allowed(state, req).await;
    let headers = r.headers_mut();
    headers.insert(hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        hyper::header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(CORS_EXPOSED),
    );
    headers.append(hyper::header::VARY, HeaderValue::from_static("origin"));
    r
}

/// The answer to a browser's CORS preflight from an allowed origin: the methods, and
/// of the headers it asks for those the gateway reads.
fn preflight(req: &hyper::Request<Incoming>, origin: HeaderValue) -> HttpResponse {
    let asked = header(req, "access-control-request-headers").unwrap_or("");
    let allowed: Vec<String> = asked
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| CORS_REQUEST_HEADERS.contains(&h.as_str()) || h.starts_with("mcp-param-"))
        .collect();
    let mut r = full(StatusCode::NO_CONTENT, "", "");
    let headers = r.headers_mut();
    headers.remove(hyper::header::CONTENT_TYPE);
    headers.insert(hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        hyper::header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE"),
    );
    if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
        headers.insert(hyper::header::ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    headers.insert(
        hyper::header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    headers.append(hyper::header::VARY, HeaderValue::from_static("origin"));
    r
}

/// A request whose Host and Origin passed.
async fn handle_allowed(state: Arc<State>, req: hyper::Request<Incoming>) -> HttpResponse {
    let identity = state.gateway.identity();
    if req
        .uri()
        .path()
        .starts_with("/.well-known/oauth-protected-resource")
    {
        // Served when JWTs are accepted: it tells clients where to get one.
        return match identity.jwt() {
            Some(jwt)
                if req.method() == Method::GET
                    && (req.uri().path() == metadata_path(&jwt.config().audience)
                        || req.uri().path() == "/.well-known/oauth-protected-resource") =>
            {
                // Public, and asked once per sign-in: closed after, as a refusal is.
                refused_before_identity(full(
                    StatusCode::OK,
                    "application/json",
                    jwt.resource_metadata().to_string(),
                ))
            }
            _ => refused_before_identity(full(StatusCode::NOT_FOUND, "", "")),
        };
    }
    if req.uri().path() != "/mcp" {
        return refused_before_identity(full(StatusCode::NOT_FOUND, "", ""));
    }
    // Two credentials, or two sessions: which one a proxy in front added (or routes
    // on) is not known. Refused, not the first taken.
    for (name, said) in [
        ("authorization", "one Authorization header only"),
        ("mcp-session-id", "one Mcp-Session-Id header only"),
    ] {
        if req.headers().get_all(name).iter().nth(1).is_some() {
            return refused_before_identity(full(StatusCode::BAD_REQUEST, "text/plain", said));
        }
    }
    // A header that is not text is still a header: it is refused, not ignored.
    let authorization = req
        .headers()
        .get("authorization")
        .map(|v| v.to_str().unwrap_or(""));
    let admitted = match identity.resolve(authorization) {
        Ok(a) => a,
        Err(e) => {
            // A valid token without the scope asked for is forbidden, not unknown: a
            // client asks for that scope, not for another token of the same kind.
            let status = match e {
                super::identity::IdentityError::InsufficientScope => StatusCode::FORBIDDEN,
                _ => StatusCode::UNAUTHORIZED,
            };
            let mut r = full(status, "text/plain", e.to_string());
            let challenge = match identity.jwt() {
                Some(jwt) => {
                    let audience = &jwt.config().audience;
                    let origin = url::Url::parse(audience)
                        .map(|u| u.origin().ascii_serialization())
                        .unwrap_or_default();
                    // RFC 6750 §3.1: a token sent and not taken, or a Bearer header
                    // without one; nothing when none was sent (another scheme's
                    // credentials are no bearer token).
                    let bearer = authorization.is_some_and(|a| {
                        let a = a.trim();
                        a.split_once(' ')
                            .map_or(a, |(scheme, _)| scheme)
                            .eq_ignore_ascii_case("bearer")
                    });
                    let invalid = match e {
                        super::identity::IdentityError::Unknown => ", error=\"invalid_token\"",
                        super::identity::IdentityError::Malformed if bearer => {
                            ", error=\"invalid_request\""
                        }
                        super::identity::IdentityError::InsufficientScope => {
                            ", error=\"insufficient_scope\""
                        }
                        _ => "",
                    };
                    // The scopes a token needs, for the client to ask for (the config's,
                    // checked as scope tokens when read).
                    let scope = jwt
                        .scopes()
                        .map(|s| format!(", scope=\"{s}\""))
                        .unwrap_or_default();
                    format!(
                        "Bearer resource_metadata=\"{origin}{}\"{scope}{invalid}",
                        metadata_path(audience)
                    )
                }
                None => "Bearer realm=\"mcp-harness\"".to_string(),
            };
            if let Ok(v) = challenge.parse() {
                r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, v);
            }
            return refused_before_identity(r);
        }
    };
    let session_id = header(&req, "mcp-session-id").map(String::from);
    match *req.method() {
        Method::POST => post(state, req, admitted, session_id).await,
        Method::GET => match session_id {
            Some(id) => open_stream(&state, &id, &admitted),
            None => not_allowed(),
        },
        Method::DELETE => match session_id {
            Some(id) => {
                let mut sessions = state.sessions.lock();
                match sessions.get(&id) {
                    Some(s) if s.principal == admitted.principal => {
                        if let Some(mut s) = sessions.remove(&id) {
                            s.end();
                        }
                        full(StatusCode::OK, "", "")
                    }
                    _ => full(StatusCode::NOT_FOUND, "", ""),
                }
            }
            None => not_allowed(),
        },
        _ => not_allowed(),
    }
}

/// A header's media type without its parameters, in lower case (media types ignore
/// case: `Application/JSON; charset=utf-8` is `application/json`).
fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Whether an `Accept` header takes `wanted` (`type/subtype`, lower case): the most
/// specific range that covers it (by name, then `type/*`, then `*/*`) decides, and
/// `q=0` says not this one (RFC 9110, 12.5.1).
fn accepts(accept: &str, wanted: &str) -> bool {
    let any_of_type = wanted.split_once('/').map(|(t, _)| format!("{t}/*"));
    let mut decided: Option<(u8, bool)> = None;
    for range in accept.split(',') {
        let name = media_type(range);
        let specific = match name.as_str() {
            n if n == wanted => 3,
            n if any_of_type.as_deref() == Some(n) => 2,
            "*/*" => 1,
            _ => continue,
        };
        let refused = range.split(';').skip(1).any(|p| {
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("q")
                    && v.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
            })
        });
        if decided.is_none_or(|(s, _)| specific > s) {
            decided = Some((specific, !refused));
        }
    }
    decided.is_some_and(|(_, taken)| taken)
}

/// 405, with the methods the endpoint takes (RFC 9110 asks for them; GET and DELETE
/// need a legacy session).
fn not_allowed() -> HttpResponse {
    let mut r = full(StatusCode::METHOD_NOT_ALLOWED, "", "");
    r.headers_mut().insert(
        hyper::header::ALLOW,
        HeaderValue::from_static("POST, GET, DELETE"),
    );
    r
}

fn open_stream(state: &Arc<State>, id: &str, admitted: &Admitted) -> HttpResponse {
    let principal = &admitted.principal;
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let (slot, place) = {
        let mut sessions = state.sessions.lock();
        let Some(session) = live_session(
            &mut sessions,
            id,
            principal,
            state.gateway.config().session_idle,
        ) else {
            return full(StatusCode::NOT_FOUND, "", "unknown session");
        };
        if admitted.credential.is_some() {
            session.credential.clone_from(&admitted.credential);
        }
        // At most a few streams per session: a client reconnecting replaces them (the
        // replaced one ends, and its place is this one's).
        session.drop_closed_streams();
        let replacing = session.streams.len() >= 4;
        let max = MAX_GETS_PER_PRINCIPAL + usize::from(replacing);
        let Some(slot) = PrincipalSlot::take(state, principal, |s| &s.gets, max) else {
            return full(
                StatusCode::SERVICE_UNAVAILABLE,
                "",
                "too many streams open for this agent",
            );
        };
        // Taken last: a request refused for its own reasons takes no place from another.
        let replaced = session.streams.first().filter(|_| replacing).map(|s| s.1);
        let Some(place) = state.streams.take(principal, replaced) else {
            return full(StatusCode::SERVICE_UNAVAILABLE, "", "too many streams open");
        };
        if replacing {
            let (_, _, owed) = session.streams.remove(0);
            session.orphaned = session.orphaned.union(owed);
        }
        // What streams gone still owed, on this fresh queue first: a client that
        // stopped reading and came back hears of what changed meanwhile.
        for method in std::mem::take(&mut session.orphaned).methods() {
            let _ = tx.try_send(sse_frame(&Message::Notification(Notification {
                method: method.into(),
                params: None,
            })));
        }
        session
            .streams
            .push((tx.clone(), place.id, ListsChanged::default()));
        (slot, place)
    };
    // The stream (and its slot) lasts until the session lets go of it (replaced,
    // ended), the client goes (noticed by a comment now and then), or its credentials
    // expire.
    let weak = tx.downgrade();
    drop(tx);
    tokio::spawn(async move {
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        loop {
            keep_alive.tick().await;
            let Some(tx) = weak.upgrade() else { return };
            if !keep_alive_sent(&tx) {
                return;
            }
        }
    });
    sse_stream(rx, Some(place), true, Some(slot), admitted.until)
}

/// Whether `principal` may start one more session among `sessions` (at most `max`,
/// `per_principal` of its own). At its own cap, the principal gives up its least
/// recently used session that has been quiet for `quiet_for` (no request, no call in
/// flight, no stream open): clients that exit without a DELETE (a crash, a CI step)
/// leave sessions behind, which would lock the principal out until they expire; live
/// clients between two requests are not taken for them. When all places are taken, the
/// principal holding the most loses its least recently used session, if it holds at
/// least two more than this one (see [`super::fair`]): enough agents each at their
/// own cap cannot keep another out.
fn room_for_session(
    sessions: &mut HashMap<String, Session>,
    principal: &Principal,
    max: usize,
    per_principal: usize,
    quiet_for: Duration,
) -> bool {
    let own = sessions
        .values()
        .filter(|s| s.principal == *principal)
        .count();
    if own >= per_principal {
        let quiet = sessions
            .iter_mut()
            .filter(|(_, s)| s.principal == *principal)
            .filter_map(|(id, s)| s.idle(quiet_for).then(|| (s.last_seen, id.clone())))
            .min();
        let Some((_, id)) = quiet else {
            return false;
        };
        if let Some(mut gone) = sessions.remove(&id) {
            // Clients make these as fast as they open sessions or streams: budgeted.
            static BUDGET: crate::util::log_budget::LogBudget =
                crate::util::log_budget::LogBudget::new();
            if let Some(count) = BUDGET.log() {
                tracing::info!(agent = %gone.principal.agent, count, "a quiet legacy session was ended to make room for another of its principal's");
            }
            gone.end();
        }
    }
    if sessions.len() >= max {
        let held = sessions
            .iter()
            .map(|(id, s)| (id, &s.principal, s.last_seen));
        let Some(id) = super::fair::place_to_free(held, principal).cloned() else {
            return false;
        };
        if let Some(mut gone) = sessions.remove(&id) {
            // Clients make these as fast as they open sessions or streams: budgeted.
            static BUDGET: crate::util::log_budget::LogBudget =
                crate::util::log_budget::LogBudget::new();
            if let Some(count) = BUDGET.log() {
                tracing::info!(agent = %gone.principal.agent, count, "a legacy session was ended to make room for another agent's");
            }
            gone.end();
        }
    }
    sessions.len() < max
}

/// The session `id` of `principal`, if it is live (an idle one is forgotten).
fn live_session<'a>(
    sessions: &'a mut HashMap<String, Session>,
    id: &str,
    principal: &Principal,
    idle: std::time::Duration,
) -> Option<&'a mut Session> {
    let expired = sessions.get_mut(id).is_some_and(|s| s.idle(idle));
    if expired && let Some(mut s) = sessions.remove(id) {
        s.end();
    }
    let session = sessions.get_mut(id).filter(|s| s.principal == *principal)?;
    session.last_seen = Instant::now();
    Some(session)
}

/// The HTTP status of a 2026-07-28 request's error. Envelope and header errors are
/// answered before this (400); an upstream's error codes pass through as 200, except
/// the spec's own codes.
fn status_of(error: &RpcError, method: &str) -> StatusCode {
    match error.code {
        -32022..=-32020 => StatusCode::BAD_REQUEST,
        METHOD_NOT_FOUND if !super::METHODS.contains(&method) => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The headers of a 2026-07-28 request must repeat its body.
fn check_headers(req_headers: &hyper::HeaderMap, request: &Request) -> Result<(), RpcError> {
    let get = |n: &str| req_headers.get(n).and_then(|v| v.to_str().ok());
    let mismatch = |what: &str| {
        Err(RpcError::new(
            HEADER_MISMATCH,
            format!("header mismatch: {what}"),
        ))
    };
    let version = request
        .params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(KEY_PROTOCOL_VERSION))
        .and_then(Value::as_str);
    if version.is_some() && get("mcp-protocol-version") != version {
        return mismatch("MCP-Protocol-Version");
    }
    if get("mcp-method") != Some(request.method.as_str()) {
        return mismatch("Mcp-Method");
    }
    if let Some(name) = mcp_name(&request.method, request.params.as_ref())
        && get("mcp-name") != Some(name.as_str())
    {
        return mismatch("Mcp-Name");
    }
    Ok(())
}

/// The first header that mirrors the body (`Mcp-Method`, `Mcp-Name`,
/// `MCP-Protocol-Version`, `Mcp-Param-*`) and comes more than once.
fn repeated_mirror(headers: &hyper::HeaderMap) -> Option<&str> {
    headers.keys().map(|k| k.as_str()).find(|k| {
        (matches!(*k, "mcp-method" | "mcp-name" | "mcp-protocol-version")
            || k.starts_with("mcp-param-"))
            && headers.get_all(*k).iter().nth(1).is_some()
    })
}

/// A legacy session's request that names a protocol version (they do from 2025-06-18
/// on) must name the session's: one this gateway does not speak, or another than the
/// session agreed, is refused (400), as the legacy transports say. One without it is
/// served (clients before 2025-06-18 send none).
fn legacy_version_checked(
    state: &State,
    headers: &hyper::HeaderMap,
    session_id: Option<&str>,
    principal: &Principal,
) -> Result<(), RpcError> {
    let (Some(sent), Some(sid)) = (headers.get("mcp-protocol-version"), session_id) else {
        return Ok(());
    };
    let sent = sent.to_str().unwrap_or_default();
    // As its request would find it: one idle past its time is gone (404 follows).
    let idle = state.gateway.config().session_idle;
    let agreed = live_session(&mut state.sessions.lock(), sid, principal, idle)
        .map(|s| s.client.version.clone());
    match agreed {
        Some(agreed) if agreed != sent => Err(RpcError::new(
            INVALID_REQUEST,
            format!(
                "MCP-Protocol-Version {} is not the session's ({agreed})",
                crate::util::text::one_line(sent, 40)
            ),
        )),
        // No such session: its own 404 follows.
        _ => Ok(()),
    }
}

/// The `Mcp-Method` and `Mcp-Name` a message carries without having to (a legacy
/// request, a notification), if any, must repeat its body too.
fn check_sent_headers(
    headers: &hyper::HeaderMap,
    method: &str,
    params: Option<&Value>,
) -> Result<(), RpcError> {
    let get = |n: &str| headers.get(n).map(|v| v.to_str().ok());
    let mismatch = |what: &str| RpcError::new(HEADER_MISMATCH, format!("header mismatch: {what}"));
    if get("mcp-method").is_some_and(|m| m != Some(method)) {
        return Err(mismatch("Mcp-Method"));
    }
    if let Some(sent) = get("mcp-name") {
        let name = mcp_name(method, params);
        if sent.is_none() || sent != name.as_deref() {
            return Err(mismatch("Mcp-Name"));
        }
    }
    Ok(())
}

/// The listener's refusal of a request, marked on the request's span if it has one.
fn refused(
    spanned: Option<&super::RequestSpan>,
    (status, e): (StatusCode, RpcError),
    id: RequestId,
) -> HttpResponse {
    if let Some(s) = spanned {
        s.refuse(&e);
    }
    error_reply(status, Some(id), e)
}

/// `work` in the request's span, if it has one.
async fn in_span<T>(spanned: Option<&super::RequestSpan>, work: impl Future<Output = T>) -> T {
    let span = spanned.map_or_else(tracing::Span::none, |s| s.span().clone());
    work.instrument(span).await
}

/// The `Mcp-Param-*` headers of a `tools/call` checked against its arguments and the
/// tool's schema (bounded: the schema is cached, or one listing away); the status and
/// error to answer instead of serving it when they are not right.
async fn params_checked(
    state: &State,
    principal: &Principal,
    request: &Request,
    headers: &hyper::HeaderMap,
) -> Result<(), (StatusCode, RpcError)> {
    let param = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let sent = headers.keys().any(|k| k.as_str().starts_with("mcp-param-"));
    let check = state
        .gateway
        .check_param_headers(principal, request, param, sent);
    match tokio::time::timeout(PARAM_CHECK_TIMEOUT, check).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.code == HEADER_MISMATCH => Err((StatusCode::BAD_REQUEST, e)),
        Ok(Err(e)) => Err((StatusCode::SERVICE_UNAVAILABLE, e)),
        // Headers unchecked are not let through: something in front of the gateway may
        // have acted on them. Without any, the call goes on (a server slow to start
        // still gets its first calls).
        Err(_) if !sent => Ok(()),
        Err(_) => {
            let e = RpcError::new(
                INTERNAL_ERROR,
                "the tool's schema could not be read in time to check its Mcp-Param headers",
            );
            Err((StatusCode::GATEWAY_TIMEOUT, e))
        }
    }
}

async fn post(
    state: Arc<State>,
    req: hyper::Request<Incoming>,
    admitted: Admitted,
    session_id: Option<String>,
) -> HttpResponse {
    let Admitted {
        principal,
        until,
        credential,
    } = admitted;
    // A list may come on several lines (RFC 9110 5.3): one, joined.
    let accept = req
        .headers()
        .get_all("accept")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .take(16)
        .collect::<Vec<_>>()
        .join(",");
    let accept = accept.as_str();
    if !(accepts(accept, "application/json") && accepts(accept, "text/event-stream")) {
        return full(
            StatusCode::NOT_ACCEPTABLE,
            "text/plain",
            "Accept must list application/json and text/event-stream",
        );
    }
    if header(&req, "content-type").is_none_or(|c| media_type(c) != "application/json") {
        return full(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "text/plain",
            "Content-Type must be application/json",
        );
    }
    let headers = req.headers().clone();
    let limit = state.gateway.config().max_body_bytes;
    // A legacy client with questions waiting may be sending an answer: its body is
    // charged to the answers' budget as it arrives (one body per question waiting), and
    // moved to the calls' once it parses as anything else.
    let reading_answer = session_id.as_deref().and_then(|sid| {
        let sessions = state.sessions.lock();
        let s = sessions.get(sid).filter(|s| s.principal == principal)?;
        s.pending.reading_answer()
    });
    let answering = reading_answer.is_some();
    let budget = match answering {
        true => ANSWERS,
        false => CALLS,
    };
    let (body, large) = match read_body(&state, &principal, req.into_body(), limit, budget).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // Charged to the answers' budget (questions were waiting) but not an answer: it is
    // a call, and takes the calls' share, or is refused as one past it would be, before
    // it is parsed (what it parses to is many times its size).
    let large = match large {
        Some(slot) if answering => match Message::peek_head(&body).unwrap_or((None, false)) {
            (_, true) => Some(slot),
            (id, false) => {
                let weight = slot.weight;
                drop(slot);
                let budget = limit.saturating_mul(LARGE_BODY_BUDGET);
                let all = limit.saturating_mul(LARGE_BODY_ALL);
                match PrincipalSlot::take_weighted(
                    &state,
                    &principal,
                    CALLS.0,
                    weight,
                    (budget, Some((all, CALLS.1))),
                ) {
                    Some(slot) => Some(slot),
                    None => return too_many_large(&principal, limit, id),
                }
            }
        },
        large => large,
    };
    // Read, and charged where it belongs.
    drop(reading_answer);
    let message = match Message::parse(&body) {
        Ok(m) => m,
        Err(e) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                None,
                RpcError::new(e.code(), e.to_string()),
            );
        }
    };
    drop(body);
    // The body decides the era: a request with the 2026-07-28 envelope is modern even
    // when a session header comes along.
    let legacy = match &message {
        Message::Request(r) if r.method == "initialize" => true,
        Message::Request(r) => {
            session_id.is_some()
                && r.params
                    .as_ref()
                    .and_then(|p| p.get("_meta"))
                    .and_then(|m| m.get(KEY_PROTOCOL_VERSION))
                    .is_none()
        }
        _ => session_id.is_some(),
    };
    // A header that mirrors the body comes once: of two, something in front of the
    // gateway may act on one while the check reads the other.
    if let Some(name) = repeated_mirror(&headers) {
        let id = match &message {
            Message::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let e = RpcError::new(HEADER_MISMATCH, format!("header mismatch: {name} repeated"));
        if let Message::Request(r) = &message
            && let Some(spanned) = state.gateway.request_span(r)
        {
            spanned.refuse(&e);
        }
        return error_reply(StatusCode::BAD_REQUEST, id, e);
    }
    // An id is written back on the answer, refused or not: one of any length would
    // make a large answer of every refusal, outside the results' budget.
    if let Message::Request(Request {
        id: RequestId::String(id),
        ..
    }) = &message
        && id.len() > MAX_REQUEST_ID
    {
        let e = RpcError::new(
            INVALID_REQUEST,
            format!("a request id of more than {MAX_REQUEST_ID} bytes"),
        );
        return error_reply(StatusCode::BAD_REQUEST, None, e);
    }
    // A principal whose large results wait to be read gets no more (see `HeldBody`).
    if let Message::Request(r) = &message
        && let Some(refused) = results_refusal(&state, &principal, Some(r.id.clone()))
    {
        return refused;
    }
    match message {
        Message::Notification(n) => {
            let params = headers.keys().any(|k| k.as_str().starts_with("mcp-param-"));
            let checked = if params {
                Err(RpcError::new(
                    HEADER_MISMATCH,
                    "header mismatch: Mcp-Param-* on a notification",
                ))
            } else {
                check_sent_headers(&headers, &n.method, n.params.as_ref())
            };
            if let Err(e) = checked {
                return error_reply(StatusCode::BAD_REQUEST, None, e);
            }
            // A session this client names that is gone (or not its own): 404, so that
            // it knows to start one again, as for its requests. A 2026-07-28 client has
            // no session: a stray header of its is ignored, as on its requests.
            if let Some(sid) = session_id.as_deref()
                && !speaks_modern(&headers)
                && !session_is_live(&state, sid, &principal)
            {
                return full(StatusCode::NOT_FOUND, "text/plain", "unknown session");
            }
            let legacy_session = session_id.as_deref().filter(|_| !speaks_modern(&headers));
            cancel_from(&state, &n, &principal, legacy_session);
            full(StatusCode::ACCEPTED, "", "")
        }
        Message::Response(r) => {
            if let Some(sid) = session_id.as_deref().filter(|_| !speaks_modern(&headers)) {
                let pending = {
                    let mut sessions = state.sessions.lock();
                    live_session(
                        &mut sessions,
                        sid,
                        &principal,
                        state.gateway.config().session_idle,
                    )
                    .map(|s| s.pending.clone())
                };
                let Some(pending) = pending else {
                    return full(StatusCode::NOT_FOUND, "text/plain", "unknown session");
                };
                if let Some(id) = r.id.as_ref() {
                    pending.answer(id, r.outcome);
                }
                return full(StatusCode::ACCEPTED, "", "");
            }
            // Only a legacy session's client is asked things over HTTP: 2026-07-28
            // clients never POST responses, and a 202 would say this one was taken.
            let e = RpcError::new(
                INVALID_REQUEST,
                "a response outside a legacy session answers nothing",
            );
            error_reply(StatusCode::BAD_REQUEST, None, e)
        }
        Message::Request(request) if legacy => {
            // A call request's span, from its arrival: the checks below run in it.
            let spanned = state.gateway.request_span(&request);
            let refused = |refusal, id| refused(spanned.as_ref(), refusal, id);
            // A legacy client has no mirror headers to send; any it sends must be true.
            let sent = headers.keys().any(|k| k.as_str().starts_with("mcp-param-"));
            if let Err(e) =
                legacy_version_checked(&state, &headers, session_id.as_deref(), &principal)
                    .and_then(|()| {
                        check_sent_headers(&headers, &request.method, request.params.as_ref())
                    })
            {
                return refused((StatusCode::BAD_REQUEST, e), request.id);
            }
            if sent {
                let checked = params_checked(&state, &principal, &request, &headers);
                if let Err(e) = in_span(spanned.as_ref(), checked).await {
                    return refused(e, request.id);
                }
            }
            let admitted = (principal, credential);
            legacy_request(state, request, admitted, session_id, large, spanned).await
        }
        Message::Request(request) => {
            let spanned = state.gateway.request_span(&request);
            let refused = |refusal, id| refused(spanned.as_ref(), refusal, id);
            // The envelope first (its error is -32602 / 400), then the headers.
            if let Err(e) = super::Gateway::check_envelope(&request)
                .and_then(|_| check_headers(&headers, &request))
            {
                return refused((StatusCode::BAD_REQUEST, e), request.id);
            }
            if request.method == "subscriptions/listen" {
                return listen_stream(state, principal, (until, credential), request);
            }
            let checked = params_checked(&state, &principal, &request, &headers);
            if let Err(e) = in_span(spanned.as_ref(), checked).await {
                return refused(e, request.id);
            }
            // A modern client cancels by going away: this handler is dropped.
            let cancel = CancelToken::new();
            let (progress, progress_rx) = if super::wants_progress(&request) {
                let (tx, rx) = mpsc::channel(32);
                (Some(tx), Some(rx))
            } else {
                (None, None)
            };
            let (id, method) = (request.id.clone(), request.method.clone());
            let work = {
                let (state, principal) = (state.clone(), principal.clone());
                async move {
                    // Held while the call's params are.
                    let _large = large;
                    state
                        .gateway
                        .handle_spanned(
                            &principal,
                            request,
                            Client::Modern { session: None },
                            (cancel, progress),
                            spanned,
                        )
                        .await
                }
            };
            let reply = |outcome: Result<Value, RpcError>| {
                let status = match &outcome {
                    Ok(_) => StatusCode::OK,
                    Err(e) => status_of(e, &method),
                };
                held_json(
                    &state,
                    &principal,
                    status,
                    &Message::Response(Response {
                        id: Some(id.clone()),
                        outcome,
                    }),
                )
            };
            let Some(mut progress_rx) = progress_rx else {
                return reply(work.await);
            };
            // JSON unless progress comes before the result: then an event stream.
            let mut work = Box::pin(work);
            let (first, done) = match first_update(&mut progress_rx, &mut work).await {
                Ok(stream) => stream,
                Err(outcome) => return reply(outcome),
            };
            let (tx, rx) = mpsc::channel(64);
            let (last_tx, last) = oneshot::channel();
            if let Some(p) = first {
                let _ = tx.try_send(progress_frame(p));
            }
            let (state, principal) = (state.clone(), principal.clone());
            tokio::spawn(async move {
                let mut open = true;
                let outcome = match done {
                    // Finished already: never polled again.
                    Some(outcome) => Some(outcome),
                    None => loop {
                        tokio::select! {
                            outcome = &mut work => break Some(outcome),
                            p = progress_rx.recv(), if open => match p {
                                // Progress is advisory: a full stream skips an update.
                                Some(p) => { let _ = tx.try_send(progress_frame(p)); }
                                None => open = false,
                            },
                            // The client went away: the call is cancelled with its stream.
                            () = tx.closed() => break None,
                        }
                    },
                };
                if let Some(outcome) = outcome {
                    // What the server sent before its result goes before it.
                    while let Ok(p) = progress_rx.try_recv() {
                        let _ = tx.send(progress_frame(p)).await;
                    }
                    let answer = Message::Response(Response {
                        id: Some(id),
                        outcome,
                    });
                    send_answer(&state, &principal, (tx, last_tx), &answer).await;
                }
            });
            call_stream(rx, last)
        }
    }
}

/// Counts one of a principal's open streams or requests (in `count`: its
/// subscriptions, its legacy GET streams, its requests with large bodies) while it
/// lives.
struct PrincipalSlot {
    state: Arc<State>,
    principal: Principal,
    count: fn(&State) -> &Mutex<HashMap<Principal, usize>>,
    weight: usize,
    /// Charged to every principal's count too, up to its bound (a large body's).
    all: AllBound,
}

/// The 503 for a large body past its principal's budget (`id`: its request's, once
/// known).
fn too_many_large(principal: &Principal, limit: usize, id: Option<RequestId>) -> HttpResponse {
    let (budget, all) = (
        limit.saturating_mul(LARGE_BODY_BUDGET),
        limit.saturating_mul(LARGE_BODY_ALL),
    );
    let mut r = error_reply(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        RpcError::new(
            -32000,
            format!(
                "too many large requests in flight (the bodies of agent {}'s at most {budget} bytes together, and every agent's {all})",
                principal.agent
            ),
        ),
    );
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    r
}

/// Adds `data` to a body's buffer if `charge` accepts what the buffer will then hold
/// allocated, not only filled: it grows by doubling (up to `limit`), reserved exactly,
/// so the charge is what it takes. False, with nothing added, when refused.
fn keep_charged(
    kept: &mut Vec<u8>,
    data: &[u8],
    limit: usize,
    charge: impl FnOnce(usize) -> bool,
) -> bool {
    let after = kept.len().saturating_add(data.len());
    let capacity = if after > kept.capacity() {
        after.max(kept.capacity().saturating_mul(2)).min(limit)
    } else {
        kept.capacity()
    };
    if !charge(capacity) {
        return false;
    }
    kept.reserve_exact(capacity.saturating_sub(kept.len()));
    kept.extend_from_slice(data);
    true
}

/// Reads a request's body: at most `limit` bytes, within [`BODY_TIMEOUT`]. Past
/// [`LARGE_BODY`], the bytes kept are charged to the principal's byte budget as they
/// arrive, and refused past it: so the raw bodies a principal holds are bounded as its
/// parsed ones are, however many connections it opens, and a client that trickles its
/// body holds only what it has sent. A body refused is still read to its end, and
/// dropped as it comes: the client gets its 503, not a connection reset in the middle
/// of its write.
async fn read_body(
    state: &Arc<State>,
    principal: &Principal,
    mut body: Incoming,
    limit: usize,
    (count, all_of): Budget,
) -> Result<(Bytes, Option<PrincipalSlot>), HttpResponse> {
    let budget = limit.saturating_mul(LARGE_BODY_BUDGET);
    let all = Some((limit.saturating_mul(LARGE_BODY_ALL), all_of));
    let mut slot: Option<PrincipalSlot> = None;
    let mut refused = false;
    let mut kept: Vec<u8> = Vec::new();
    let read = async {
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| ())?.into_data() else {
                continue; // trailers
            };
            seen = seen.saturating_add(data.len());
            if seen > limit {
                return Ok(false);
            }
            if refused {
                continue;
            }
            let charge = |capacity: usize| {
                capacity <= LARGE_BODY
                    || match slot.as_mut() {
                        Some(s) => capacity <= s.weight || s.grow(capacity - s.weight, budget),
                        None => {
                            slot = PrincipalSlot::take_weighted(
                                state,
                                principal,
                                count,
                                capacity,
                                (budget, all),
                            );
                            slot.is_some()
                        }
                    }
            };
            if !keep_charged(&mut kept, &data, limit, charge) {
                refused = true;
                slot = None;
                kept = Vec::new();
            }
        }
        Ok::<bool, ()>(true)
    };
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(true)) if !refused => Ok((Bytes::from(kept), slot)),
        Ok(Ok(true)) => Err(too_many_large(principal, limit, None)),
        Ok(Ok(false)) => Err(full(
            StatusCode::PAYLOAD_TOO_LARGE,
            "text/plain",
            format!("request bodies are limited to {limit} bytes"),
        )),
        Ok(Err(())) => Err(full(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "the body could not be read",
        )),
        Err(_) => Err(full(
            StatusCode::REQUEST_TIMEOUT,
            "text/plain",
            "body too slow",
        )),
    }
}

impl PrincipalSlot {
    /// One more of `principal`'s in `count`, if it has fewer than `max`.
    fn take(
        state: &Arc<State>,
        principal: &Principal,
        count: fn(&State) -> &Mutex<HashMap<Principal, usize>>,
        max: usize,
    ) -> Option<PrincipalSlot> {
        Self::take_weighted(state, principal, count, 1, (max, None))
    }

    /// `weight` more of `principal`'s in `count`, if that stays within `max` (one is
    /// always let in while it holds none, however heavy), and of every principal's
    /// large bodies within `all`, when given.
    fn take_weighted(
        state: &Arc<State>,
        principal: &Principal,
        count: fn(&State) -> &Mutex<HashMap<Principal, usize>>,
        weight: usize,
        (max, all): (usize, AllBound),
    ) -> Option<PrincipalSlot> {
        let mut open = count(state).lock();
        let n = open.entry(principal.clone()).or_default();
        if *n > 0 && n.saturating_add(weight) > max || *n >= max {
            return None;
        }
        if let Some((bound, all_of)) = all
            && !charge_all(all_of(state), weight, bound)
        {
            if *n == 0 {
                open.remove(principal);
            }
            return None;
        }
        *n = n.saturating_add(weight);
        Some(PrincipalSlot {
            state: state.clone(),
            principal: principal.clone(),
            count,
            weight,
            all,
        })
    }
}

impl PrincipalSlot {
    /// `weight` more of `principal`'s in `budget`, whatever it comes to: for what is
    /// made already (a result), which the budget's check refuses the next of.
    fn charged(
        state: &Arc<State>,
        principal: &Principal,
        (count, all_of): Budget,
        weight: usize,
    ) -> PrincipalSlot {
        {
            let mut open = count(state).lock();
            let n = open.entry(principal.clone()).or_default();
            *n = n.saturating_add(weight);
        }
        all_of(state).fetch_add(weight, Ordering::AcqRel);
        PrincipalSlot {
            state: state.clone(),
            principal: principal.clone(),
            count,
            weight,
            all: Some((usize::MAX, all_of)),
        }
    }
}

/// Adds `weight` to every principal's large bodies (`all`), if they stay within `bound`.
fn charge_all(all: &AtomicUsize, weight: usize, bound: usize) -> bool {
    all.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
        held.checked_add(weight).filter(|t| *t <= bound)
    })
    .is_ok()
}

impl PrincipalSlot {
    /// `extra` more of its principal's, if that stays within `max`; `false` leaves it
    /// as it was.
    fn grow(&mut self, extra: usize, max: usize) -> bool {
        let mut open = (self.count)(&self.state).lock();
        let n = open.entry(self.principal.clone()).or_default();
        if n.saturating_add(extra) > max {
            return false;
        }
        if let Some((bound, all_of)) = self.all
            && !charge_all(all_of(&self.state), extra, bound)
        {
            return false;
        }
        *n = n.saturating_add(extra);
        self.weight = self.weight.saturating_add(extra);
        true
    }
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        if let Some((_, all_of)) = self.all {
            all_of(&self.state).fetch_sub(self.weight, Ordering::AcqRel);
        }
        let mut open = (self.count)(&self.state).lock();
        if let Some(n) = open.get_mut(&self.principal) {
            *n = n.saturating_sub(self.weight);
            if *n == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

/// A `subscriptions/listen`: its own event stream, the acknowledgement first, then the
/// tool list changes of servers the principal may use, each tagged with the listen's
/// id. It ends when the client closes it, or with its final result when the gateway
/// shuts down, a reload revokes its principal, or its credentials expire (`until`).
fn listen_stream(
    state: Arc<State>,
    principal: Principal,
    (until, credential): (Option<Instant>, Option<super::Credential>),
    request: Request,
) -> HttpResponse {
    // Its id is kept, and written on every frame, for as long as the stream is open:
    // not a body's worth of it (the body's budget ends with this request).
    if matches!(&request.id, RequestId::String(s) if s.len() > MAX_KEPT_ID) {
        return error_reply(
            StatusCode::BAD_REQUEST,
            Some(request.id),
            RpcError::new(
                INVALID_REQUEST,
                format!("a subscription's id is at most {MAX_KEPT_ID} bytes"),
            ),
        );
    }
    let Some(slot) = PrincipalSlot::take(
        &state,
        &principal,
        |s| &s.listens,
        MAX_LISTENS_PER_PRINCIPAL,
    ) else {
        return error_reply(
            StatusCode::OK,
            Some(request.id),
            RpcError::new(-32000, "too many subscriptions open for this agent"),
        );
    };
    let Some(place) = state.streams.take(&principal, None) else {
        return error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(request.id),
            RpcError::new(-32000, "too many streams open on this gateway"),
        );
    };
    let taken = place.taken.clone();
    let accepted = Gateway::listen_accepts(request.params.as_ref());
    let lists = Gateway::listen_lists(&accepted);
    let id = request.id;
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let _ = tx.try_send(sse_frame(&Gateway::listen_ack(&id, accepted)));
    let mut events = state.gateway.harness().subscribe();
    let mut views = state.gateway.views();
    // Taken now, and checked at once: a reload between the principal's check and the
    // task's first poll is not missed.
    let mut reloads = state.gateway.reloads();
    reloads.mark_changed();
    tokio::spawn(async move {
        let frames: Vec<(&str, Bytes)> = (lists.methods())
            .map(|m| (m, sse_frame(&Gateway::listen_changed(&id, m))))
            .collect();
        let expired = async {
            match until {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        // The issuer's keys as they were when the stream was let in: a change read
        // from its URL between reloads has the JWT checked again, at the next tick.
        let mut keys_seen = slot.state.gateway.identity().keys_changed();
        // A change that finds the queue full (of other lists' changes, perhaps) is owed
        // until there is room, not dropped: the client's list would stay stale.
        let mut owed = super::Owed::default();
        let send = |method: &str| match frames.iter().find(|(m, _)| *m == method) {
            Some((_, frame)) => !matches!(
                tx.try_send(frame.clone()),
                Err(mpsc::error::TrySendError::Full(_))
            ),
            None => true,
        };
        loop {
            tokio::select! {
                event = events.recv() => {
                    let changed = match &event {
                        Ok(e) => slot.state.gateway.changes(&slot.principal, e),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => ListsChanged::ALL,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    };
                    owed.send(changed.intersect(lists), send);
                }
                Ok(()) = views.changed() => owed.send(Gateway::VIEW_CHANGED.intersect(lists), send),
                owed_now = owed.due() => owed.send(owed_now, send),
                () = tx.closed() => return,
                () = slot.state.closing.cancelled() => break,
                // Its place went to another principal's stream.
                () = taken.cancelled() => break,
                // A comment now and then: a client that vanished without a word is
                // noticed, and its slot freed.
                _ = keep_alive.tick() => {
                    if !keep_alive_sent(&tx) {
                        return;
                    }
                    let identity = slot.state.gateway.identity();
                    let keys = identity.keys_changed();
                    if credential.is_some() && keys != keys_seen {
                        keys_seen = keys;
                        if !identity.admits_with(&slot.principal, credential.as_ref()) {
                            tracing::info!(agent = %slot.principal.agent, "a subscription whose JWT no longer verifies under the issuer's keys was ended");
                            break;
                        }
                    }
                }
                // A reload that revoked its principal ends it, as its next request
                // would be refused.
                Ok(()) = reloads.changed() => {
                    let identity = slot.state.gateway.identity();
                    if !identity.admits_with(&slot.principal, credential.as_ref()) {
                        if credential.is_some() {
                            tracing::info!(agent = %slot.principal.agent, "a subscription whose bearer token no longer admits it was ended");
                        }
                        break;
                    }
                }
                // As its next request would be refused.
                () = &mut expired => break,
            }
        }
        // The spec's final result, after what is queued: waited for as any write is
        // (a client that does not read has its connection closed by then anyway).
        let end = sse_frame(&Gateway::listen_end(&id));
        let write_timeout = slot.state.gateway.config().write_timeout;
        let _ = tokio::time::timeout(write_timeout, tx.send(end)).await;
    });
    sse_stream(rx, Some(place), false, None, None)
}

/// Whether the client says it speaks 2026-07-28 (`MCP-Protocol-Version`).
fn speaks_modern(headers: &hyper::HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .is_some_and(|v| v.as_bytes() == crate::protocol::meta::MODERN.as_bytes())
}

/// Whether `sid` is a live session of `principal` (seen now, so it is kept).
fn session_is_live(state: &State, sid: &str, principal: &Principal) -> bool {
    let mut sessions = state.sessions.lock();
    live_session(
        &mut sessions,
        sid,
        principal,
        state.gateway.config().session_idle,
    )
    .is_some()
}

/// `notifications/cancelled` cancels the request it names on the legacy session it
/// comes on, if that is this principal's. Without a session it is ignored: a modern
/// client cancels by closing the request's stream (the spec has it post none), and
/// the clients of one principal (every anonymous one, say) would cancel each other's
/// requests by their ids.
fn cancel_from(state: &State, n: &Notification, principal: &Principal, session: Option<&str>) {
    if n.method != "notifications/cancelled" {
        return;
    }
    let Some(id) = n
        .params
        .as_ref()
        .and_then(|p| p.get("requestId"))
        .and_then(|v| serde_json::from_value::<RequestId>(v.clone()).ok())
    else {
        return;
    };
    let Some(sid) = session else {
        return;
    };
    if let Some(s) = state
        .sessions
        .lock()
        .get_mut(sid)
        .filter(|s| s.principal == *principal)
    {
        // A long id is not kept: a session's kept cancellations stay small.
        if matches!(&id, RequestId::String(s) if s.len() > MAX_KEPT_ID) {
            s.calls.cancel(&id_key(&id));
        } else {
            s.calls.cancel_or_keep(id_key(&id));
        }
    }
}

/// Longest string id whose cancellation is kept for a request still on its way, and
/// of a subscription (its id is on every frame of its stream).
const MAX_KEPT_ID: usize = 256;
/// Longest string id of a request taken at all (its answer carries it back).
const MAX_REQUEST_ID: usize = 1024;

/// The gateway's requests to a legacy client during one call: frames on the call's
/// event stream, answers matched by id through the session.
struct StreamPeer {
    out: mpsc::UnboundedSender<Bytes>,
    pending: Pending,
    prefix: String,
    next: AtomicU64,
}

impl ClientPeer for StreamPeer {
    fn request(&self, method: &str, params: Value) -> PeerFuture {
        let id = RequestId::String(format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        ));
        let out = &self.out;
        let later = self.out.clone();
        self.pending.ask(
            id,
            method,
            params,
            |m| out.send(sse_frame(m)).is_ok(),
            move |m| {
                let _ = later.send(sse_frame(m));
            },
        )
    }
}

/// Removes a legacy request's entry from its session when its handling ends.
struct SessionTicket {
    state: Arc<State>,
    session: String,
    key: RequestId,
    ticket: u64,
}

impl Drop for SessionTicket {
    fn drop(&mut self) {
        if let Some(s) = self.state.sessions.lock().get_mut(&self.session) {
            s.calls.remove(&self.key, self.ticket);
            // Its idle time counts from the call's end, not its start.
            s.last_seen = Instant::now();
        }
    }
}

async fn legacy_request(
    state: Arc<State>,
    request: Request,
    (principal, credential): (Principal, Option<super::Credential>),
    session_id: Option<String>,
    large: Option<PrincipalSlot>,
    spanned: Option<super::RequestSpan>,
) -> HttpResponse {
    let idle = state.gateway.config().session_idle;
    if request.method == "initialize" {
        let (result, client) = match state.gateway.initialize(request.params.as_ref()) {
            Ok(r) => r,
            Err(e) => return error_reply(StatusCode::OK, Some(request.id), e),
        };
        // The id first: a session that cannot start takes no place from another.
        let Some(id) = new_session_id() else {
            return full(StatusCode::INTERNAL_SERVER_ERROR, "", "");
        };
        let mut sessions = state.sessions.lock();
        sessions.retain(|_, s| {
            let live = !s.idle(idle);
            if !live {
                s.end();
            }
            live
        });
        if !room_for_session(
            &mut sessions,
            &principal,
            MAX_SESSIONS,
            MAX_SESSIONS_PER_PRINCIPAL,
            idle / 10,
        ) {
            return full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "too many sessions",
            );
        }
        sessions.insert(
            id.clone(),
            Session {
                principal,
                credential: credential.clone(),
                client,
                last_seen: Instant::now(),
                pending: Pending::default(),
                streams: Vec::new(),
                orphaned: ListsChanged::default(),
                calls: InFlight::default(),
            },
        );
        let mut r = json_message(
            StatusCode::OK,
            &Message::Response(Response {
                id: Some(request.id),
                outcome: Ok(result),
            }),
        );
        if let Ok(v) = id.parse() {
            r.headers_mut().insert("mcp-session-id", v);
        }
        return r;
    }
    // A call refused for its session is marked so in its span (404 has no JSON-RPC
    // code: it is marked as the invalid request it is).
    let refuse = |e: &RpcError| {
        if let Some(s) = &spanned {
            s.refuse(e);
        }
    };
    let Some(sid) = session_id else {
        let e = RpcError::new(INVALID_REQUEST, "no session: initialize first");
        refuse(&e);
        return error_reply(StatusCode::BAD_REQUEST, Some(request.id), e);
    };
    let found = {
        let mut sessions = state.sessions.lock();
        live_session(&mut sessions, &sid, &principal, idle).map(|s| {
            if credential.is_some() {
                s.credential.clone_from(&credential);
            }
            let (by_client, cancel) = (CancelToken::new(), CancelToken::new());
            let ticket = s
                .calls
                .insert(id_key(&request.id), by_client.clone(), cancel.clone());
            (
                s.client.clone(),
                s.pending.clone(),
                (by_client, cancel),
                ticket,
            )
        })
    };
    let Some((client, pending, (by_client, cancel), ticket)) = found else {
        refuse(&RpcError::new(INVALID_REQUEST, "unknown session"));
        return full(StatusCode::NOT_FOUND, "text/plain", "unknown session");
    };
    let entry = SessionTicket {
        state: state.clone(),
        session: sid,
        key: id_key(&request.id),
        ticket,
    };
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    let peer = StreamPeer {
        out: out_tx.clone(),
        pending,
        prefix: format!("g{}", state.next_request.fetch_add(1, Ordering::Relaxed)),
        next: AtomicU64::new(1),
    };
    let id = request.id.clone();
    // Progress goes on the same stream as the questions, read here directly so that
    // what the server sent before its result is written before it.
    let (progress, mut progress_rx) = if super::wants_progress(&request) {
        let (tx, rx) = mpsc::channel::<Value>(32);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let answered_to = principal.clone();
    let work = {
        let state = state.clone();
        let cancel = cancel.clone();
        async move {
            let _entry = entry;
            // Held while the call's params are.
            let _large = large;
            let client = Client::Legacy {
                client: &client,
                peer: Some(&peer),
            };
            state
                .gateway
                .handle_spanned(&principal, request, client, (cancel, progress), spanned)
                .await
        }
    };
    let mut work = Box::pin(work);
    // JSON when the call needs nothing of the client and sends no progress; an event
    // stream from its first question or update on.
    let (first, done) = tokio::select! {
        // Frames first: what was queued before the result is not lost.
        biased;
        frame = out_rx.recv() => (frame, None),
        Some(p) = recv_some(&mut progress_rx) => (Some(progress_frame(p)), None),
        // Updates queued on another worker while this poll finished the call go first.
        outcome = &mut work => match progress_rx.as_mut().map(|r| r.try_recv()) {
            Some(Ok(p)) => (Some(progress_frame(p)), Some(outcome)),
            // A request its client cancelled is not answered, as both eras'
            // cancellation pages ask of a receiver: its stream ends empty. (One the
            // session's end cancelled is: its client asked nothing.)
            _ if by_client.is_cancelled() => return sse_response(mpsc::channel(1).1),
            _ => {
                let answer = Message::Response(Response { id: Some(id), outcome });
                return held_json(&state, &answered_to, StatusCode::OK, &answer);
            }
        },
    };
    // Frames are few (at most MAX_QUESTIONS questions and the answer; progress is
    // dropped when the stream is full), so a small bound only makes a stalled client
    // wait.
    let (tx, rx) = mpsc::channel(super::MAX_QUESTIONS + 34);
    let (last_tx, last) = oneshot::channel();
    if let Some(frame) = first {
        let _ = tx.try_send(frame);
    }
    tokio::spawn(async move {
        let mut work = work;
        let outcome = match done {
            // Finished already: never polled again.
            Some(outcome) => Some(outcome),
            None => loop {
                tokio::select! {
                    biased;
                    frame = out_rx.recv() => {
                        if let Some(frame) = frame
                            && tx.send(frame).await.is_err()
                        {
                            cancel.cancel();
                        }
                    }
                    Some(p) = recv_some(&mut progress_rx) => {
                        let _ = tx.try_send(progress_frame(p));
                    }
                    outcome = &mut work => break Some(outcome),
                    // The client went away: the call is cancelled with its stream.
                    () = tx.closed() => {
                        cancel.cancel();
                        break None;
                    }
                }
            },
        };
        if let Some(outcome) = outcome {
            // What was sent before the result goes before it.
            while let Ok(frame) = out_rx.try_recv() {
                let _ = tx.send(frame).await;
            }
            while let Some(p) = progress_rx.as_mut().and_then(|r| r.try_recv().ok()) {
                let _ = tx.try_send(progress_frame(p));
            }
            // Cancelled by its client: not answered.
            if !by_client.is_cancelled() {
                let answer = Message::Response(Response {
                    id: Some(id),
                    outcome,
                });
                send_answer(&state, &answered_to, (tx, last_tx), &answer).await;
            }
        }
    });
    drop(out_tx);
    call_stream(rx, last)
}

/// How a call that wants progress answers: `Err(outcome)`, as plain JSON, when it
/// finished with no update queued; otherwise `Ok((first, done))`, as an event stream,
/// `done` holding the outcome when the call finished already (it is not polled again).
/// Progress is looked at first, and once more when the call is done: the relay may queue
/// updates on another worker during the very poll that finishes the call.
async fn first_update<T>(
    progress: &mut mpsc::Receiver<Value>,
    work: &mut (impl Future<Output = T> + Unpin),
) -> Result<(Option<Value>, Option<T>), T> {
    tokio::select! {
        biased;
        // A sender gone without an update (a token not taken) is no progress.
        Some(first) = progress.recv() => Ok((Some(first), None)),
        outcome = work => match progress.try_recv() {
            Ok(p) => Ok((Some(p), Some(outcome))),
            Err(_) => Err(outcome),
        },
    }
}

/// The next item of an optional receiver (never, when there is none or it is closed).
async fn recv_some<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => match r.recv().await {
            Some(v) => Some(v),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

fn new_session_id() -> Option<String> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).ok()?;
    Some(raw.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Keep-alives on a stream nobody reads take one place at most: a list change
    // still finds room. Before, they filled the queue and the change was dropped.
    #[tokio::test]
    async fn keep_alives_leave_room_for_a_change() {
        let (tx, mut rx) = mpsc::channel::<Bytes>(STREAM_QUEUE);
        for _ in 0..3 * STREAM_QUEUE {
            assert!(keep_alive_sent(&tx));
        }
        assert!(tx.try_send(Bytes::from_static(b"change")).is_ok());
        assert_eq!(rx.recv().await.as_deref(), Some(&b": keep-alive\n\n"[..]));
        assert_eq!(rx.recv().await.as_deref(), Some(&b"change"[..]));
        drop(rx);
        assert!(!keep_alive_sent(&tx), "the stream is gone");
    }
    use serde_json::json;

    // A change that finds a GET stream's queue full (of another list's changes) is owed
    // and sent once there is room, not dropped. Before, a session whose queue held only
    // tools changes never heard that its prompts changed.
    #[test]
    fn a_change_a_full_stream_cannot_take_is_sent_once_there_is_room() {
        let (tx, mut rx) = mpsc::channel::<Bytes>(1);
        let mut session = Session {
            principal: super::super::fair::agent("a"),
            credential: None,
            client: LegacyClient {
                version: "2025-06-18".into(),
                capabilities: json!({}),
            },
            last_seen: Instant::now(),
            pending: Pending::default(),
            streams: vec![(tx, 1, ListsChanged::default())],
            orphaned: ListsChanged::default(),
            calls: InFlight::default(),
        };
        let frames: Vec<(&str, Bytes)> = ListsChanged::ALL
            .methods()
            .map(|m| (m, Bytes::from(m)))
            .collect();
        let only = |method: &str| {
            let mut lists = ListsChanged::default();
            lists.mark(method);
            lists
        };
        let tools = "notifications/tools/list_changed";
        let prompts = "notifications/prompts/list_changed";
        assert!(!session.tell(only(tools), &frames), "room for one");
        assert!(
            session.tell(only(prompts), &frames),
            "the prompts change is owed"
        );
        assert_eq!(rx.try_recv().ok().as_deref(), Some(tools.as_bytes()));
        assert!(
            !session.tell(ListsChanged::default(), &frames),
            "sent on the retry"
        );
        assert_eq!(rx.try_recv().ok().as_deref(), Some(prompts.as_bytes()));
        // A stream that goes away owing a change leaves it to the session's next one.
        assert!(!session.tell(only(tools), &frames));
        assert!(session.tell(only(prompts), &frames));
        drop(rx);
        assert!(!session.tell(ListsChanged::default(), &frames));
        assert!(session.streams.is_empty());
        let mut lost = ListsChanged::default();
        lost.mark(prompts);
        assert_eq!(session.orphaned, lost, "kept for the next stream");
    }

    #[test]
    fn when_all_sessions_are_taken_the_agent_holding_most_loses_its_least_used_one() {
        use super::super::fair::agent;
        let (a, b, c) = (agent("a"), agent("b"), agent("c"));
        let start = Instant::now();
        // Each session with a call in flight, whose token tells whether it ended.
        let calls = std::cell::RefCell::new(HashMap::new());
        let session = |principal: &Principal, seen: u64| {
            let token = CancelToken::new();
            let mut in_flight = InFlight::default();
            in_flight.insert(RequestId::Number(1), token.clone(), token.clone());
            calls.borrow_mut().insert(seen, token);
            Session {
                principal: principal.clone(),
                credential: None,
                client: LegacyClient {
                    version: "2025-06-18".into(),
                    capabilities: json!({}),
                },
                last_seen: start + Duration::from_secs(seen),
                pending: Pending::default(),
                streams: Vec::new(),
                orphaned: ListsChanged::default(),
                calls: in_flight,
            }
        };
        let mut sessions: HashMap<String, Session> = [
            ("a1", session(&a, 3)),
            ("a2", session(&a, 1)),
            ("a3", session(&a, 2)),
            ("b1", session(&b, 4)),
        ]
        .into_iter()
        .map(|(id, s)| (id.to_string(), s))
        .collect();
        // Full (four): c takes the place of a's least recently used session, which ends.
        assert!(room_for_session(&mut sessions, &c, 4, 3, Duration::ZERO));
        let mut ids: Vec<&str> = sessions.keys().map(String::as_str).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a1", "a3", "b1"]);
        let ended: Vec<u64> = calls
            .borrow()
            .iter()
            .filter(|(_, t)| t.is_cancelled())
            .map(|(seen, _)| *seen)
            .collect();
        assert_eq!(
            ended,
            [1],
            "the session taken ends (its calls are cancelled)"
        );
        sessions.insert("c1".into(), session(&c, 5));
        // a holds two, b and c one: nobody gives a place to b, nor to a.
        assert!(!room_for_session(&mut sessions, &b, 4, 3, Duration::ZERO));
        assert!(!room_for_session(&mut sessions, &a, 4, 3, Duration::ZERO));
        assert_eq!(sessions.len(), 4);
        // Under the cap, only an agent's own cap counts.
        sessions.remove("b1");
        assert!(room_for_session(&mut sessions, &a, 4, 3, Duration::ZERO));
        assert!(!room_for_session(&mut sessions, &a, 4, 2, Duration::ZERO));

        // At its own cap, a principal gives up its session quiet for long enough (no
        // call, no stream, no request for `quiet_for`), never one seen since.
        let d = agent("d");
        let quiet = |ago: u64| Session {
            principal: d.clone(),
            credential: None,
            client: LegacyClient {
                version: "2025-06-18".into(),
                capabilities: json!({}),
            },
            last_seen: Instant::now()
                .checked_sub(Duration::from_secs(ago))
                .unwrap_or_else(Instant::now),
            pending: Pending::default(),
            streams: Vec::new(),
            orphaned: ListsChanged::default(),
            calls: InFlight::default(),
        };
        let mut own: HashMap<String, Session> = [("d1", quiet(1)), ("d2", quiet(2))]
            .into_iter()
            .map(|(id, s)| (id.to_string(), s))
            .collect();
        let minute = Duration::from_secs(60);
        assert!(
            !room_for_session(&mut own, &d, 16, 2, minute),
            "both seen within it"
        );
        own.insert("d3".into(), quiet(120));
        assert!(room_for_session(&mut own, &d, 16, 3, minute));
        assert!(
            !own.contains_key("d3") && own.len() == 2,
            "the quiet one went"
        );
    }

    #[tokio::test]
    async fn an_update_queued_while_the_call_finishes_goes_before_its_result() {
        // One poll queues an update and finishes the call, as when the relay forwards
        // on another worker while the request's task finishes the call.
        let (tx, mut rx) = mpsc::channel(4);
        let mut work = Box::pin(async move {
            let _ = tx.try_send(json!({"progress": 1}));
            "done"
        });
        let got = first_update(&mut rx, &mut work).await;
        assert_eq!(got.ok(), Some((Some(json!({"progress": 1})), Some("done"))));
        // Nothing queued: the outcome alone, for plain JSON.
        let (_tx, mut rx) = mpsc::channel::<Value>(4);
        let mut work = Box::pin(async { "done" });
        assert_eq!(first_update(&mut rx, &mut work).await.err(), Some("done"));
    }

    #[test]
    fn a_bodys_charge_covers_what_its_buffer_holds_allocated() {
        // Frames of the sizes a socket may deliver: what is charged before each is kept
        // is never less than the buffer's allocation after it, nor than the limit allows.
        let limit = 262_144;
        for frames in [
            vec![8_192; 32],
            vec![10_000; 26],
            vec![1; 1_000],
            vec![100_000, 1, 100_000, 1, 62_142],
            vec![65_537, 65_537, 65_537, 65_533],
        ] {
            let mut kept: Vec<u8> = Vec::new();
            for frame in frames {
                let mut charged = 0;
                let data = vec![b'x'; frame];
                assert!(keep_charged(&mut kept, &data, limit, |c| {
                    charged = c;
                    true
                }));
                assert!(charged <= limit);
                assert!(
                    kept.capacity() <= charged,
                    "{} allocated, {charged} charged",
                    kept.capacity()
                );
            }
            // Refused: nothing is added.
            let before = kept.len();
            assert!(!keep_charged(&mut kept, b"more", limit, |_| false));
            assert_eq!(kept.len(), before);
        }
    }
}
